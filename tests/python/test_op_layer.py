"""Issue 27, the op layer: a CUDA factory never runs a CPU factory. What both backends read of an op at plan time
(input checks, attributes, output dtypes and shapes) is a function of executor/ops/ that the CPU factory and its
CUDA twin both call (executor/ops/README.md). The CUDA factories that still run the CPU factory, through
`host_prepare(ctx, host)` or `host(ctx)` (executor/cuda/common.h), are counted here per file against an explicit
list: a new site fails, and so does a listed one that is gone, so the list only shrinks. Read from the sources, so
no build is needed."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
CUDA = ROOT / "executor" / "cuda"
# A call of the CPU factory from a CUDA one: the helper that discards its kernel, or the factory itself (on the
# node's context or, as the traced data-movement ops do, on a copy of it).
SITE = re.compile(r"\bhost_prepare\(|\bhost\(\w+\)")

# CUDA file -> sites that still run the CPU factory. Shrink it as the families move to executor/ops/; do not grow
# it. Why each remaining one is still here: executor/ops/README.md, "A CUDA factory never runs a CPU factory".
KNOWN_SITES = {
    "matmul.cu": 2,
    "shape.cu": 2,
}


def code(text):
    """The text without comments, so prose that names a site is not one."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def sites():
    found = {}
    for path in sorted(CUDA.glob("*.cu")) + sorted(CUDA.glob("*.cuh")):
        n = len(SITE.findall(code(path.read_text(errors="replace"))))
        if n:
            found[path.name] = n
    return found


def test_cuda_factories_run_no_cpu_factory_beyond_the_known_sites():
    found = sites()
    grown = {f: (n, KNOWN_SITES.get(f, 0)) for f, n in found.items() if n > KNOWN_SITES.get(f, 0)}
    assert not grown, (
        "CUDA factories that run the CPU factory (host_prepare(ctx, host) or host(...)): file -> (found, allowed). "
        f"Give the op a function in executor/ops/ that both factories call instead: {grown}")


def test_the_known_sites_are_not_stale():
    found = sites()
    gone = {f: (found.get(f, 0), n) for f, n in KNOWN_SITES.items() if found.get(f, 0) < n}
    assert not gone, f"sites gone (file -> (found, listed)): lower their counts in KNOWN_SITES: {gone}"


def test_the_checker_sees_sites():
    # Guards the tests above against passing because the pattern matched nothing.
    assert SITE.search("  host_prepare(ctx, host);") and SITE.search("auto k = host(ctx);")
    assert SITE.search("std::unique_ptr<Kernel> tracer = host(t);") and not SITE.search("make_traced(ctx, host, s)")
    assert not SITE.search(code("// host_prepare(ctx, host) is gone"))
    assert (ROOT / "executor" / "cuda" / "common.h").exists()
