"""Issue 27, the op layer: a CUDA factory never runs a CPU factory. What both backends read of an op at plan time
(input checks, attributes, output dtypes and shapes) is a function of executor/ops/ that the CPU factory and its
CUDA twin both call (executor/ops/README.md). Since every family moved there, cuda::twin() takes only the CPU defs'
key (executor/cuda/registry.cpp) and no CUDA factory receives a CPU one; this guards that no CUDA source finds its
way back to one: by the helper and factory type that existed for it, or by reading a registered def's factory. Read
from the sources, so no build is needed."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CUDA = ROOT / "executor" / "cuda"
# What running the CPU factory from a CUDA one took: the helper that discarded its kernel, the factory type that
# handed it over, a call of it (`host(ctx)`), or a def's factory read out of the registry.
SITE = re.compile(r"\bhost_prepare\(|\bCudaFactory\b|\bhost\(\w+\)|\.factory\s*\(|\bKernelFactory\s+\w+\s*=\s*\w+\.factory\b")


def code(text):
    """The text without comments, so prose that names a site is not one."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def sites():
    found = {}
    for path in sorted(CUDA.glob("*.cu")) + sorted(CUDA.glob("*.cuh")) + sorted(CUDA.glob("*.h")) + \
            sorted(CUDA.glob("*.cpp")):
        hits = SITE.findall(code(path.read_text(errors="replace")))
        if hits:
            found[path.name] = hits
    return found


def test_no_cuda_factory_runs_a_cpu_factory():
    found = sites()
    assert not found, (
        "CUDA code that runs (or gets hold of) a CPU factory: file -> matches. Give the op a prepare_<op>() in "
        f"executor/ops/ that both factories call instead: {found}")


def test_twin_takes_the_cpu_defs_key_not_their_factory():
    registry = code((CUDA / "registry.cpp").read_text())
    body = registry[registry.index("void twin("):]
    body = body[:body.index("\n}\n")]
    assert "d.factory = f;" in body and "KernelFactory f)" in body


def test_the_checker_sees_sites():
    # Guards the tests above against passing because the pattern matched nothing.
    assert SITE.search("  host_prepare(ctx, host);") and SITE.search("auto k = host(ctx);")
    assert SITE.search("std::unique_ptr<Kernel> tracer = host(t);") and SITE.search("CudaFactory f")
    assert SITE.search("return d.factory(ctx);") and SITE.search("KernelFactory host = d.factory;")
    assert not SITE.search("d.factory = f;") and not SITE.search("twin(r, op, make_mapped<ops::x>)")
    assert not SITE.search(code("// host_prepare(ctx, host) is gone"))
    assert (CUDA / "common.h").exists() and (CUDA / "registry.cpp").exists()
