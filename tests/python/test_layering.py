"""The include rules of docs/architecture.md, checked over the sources so a new include that breaks them fails
here rather than in a reviewer's reading.

Layers may include only the layers the table allows. Inside executor/, the device-neutral op definitions
(executor/ops/) include neither backend, and the CUDA backend's includes of CPU headers and the core's of a backend
are exactly the known exceptions listed below (none left since issue 27): a new one fails, and so does a listed
one that is gone, so the list cannot go stale."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BELOW = {"formulas", "graph", "gradients", "losses", "optimizers", "executor", "distributed"}
# formulas/ (element maths written once as templates, header-only) is the bottom layer: it includes no project
# header, and every layer may include it.
ALLOWED = {
    "formulas": set(),
    "graph": {"formulas"},
    "gradients": {"formulas", "graph"},
    "losses": {"formulas", "graph"},
    "optimizers": {"formulas", "graph"},
    "executor": {"formulas", "graph"},
    "distributed": {"formulas", "executor", "graph"},
    "training": BELOW,
    "cli": BELOW | {"training"},
    "python": BELOW | {"training"},
}
# CUDA files that still include CPU headers (docs/architecture.md, "Known exceptions"): none since issue 27 moved
# the factories' helpers and the Einsum and Resize plans to executor/ops/; the set stays so a new one fails.
CUDA_TO_CPU = set()
# Device-neutral core files (executor/*.h, *.cpp) that still include a backend: none since issue 27 made the CPU
# fusion a plan pass the CPU backend registers (executor/plan_pass.h); the set stays so a new one fails.
CORE_TO_BACKEND = set()
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"', re.M)


def includes():
    for layer in ALLOWED:
        for path in sorted((ROOT / layer).rglob("*")):
            if path.suffix in {".h", ".cpp", ".cu", ".cuh"}:
                rel = path.relative_to(ROOT).as_posix()
                for m in INCLUDE.finditer(path.read_text(errors="replace")):
                    yield layer, rel, m.group(1), f"{m.group(1)}/{m.group(2)}"


def test_layers_include_only_the_layers_below_them():
    wrong = [f"{rel}: {inc} ({layer} may include {sorted(ALLOWED[layer])})"
             for layer, rel, top, inc in includes() if top in ALLOWED and top != layer and top not in ALLOWED[layer]]
    assert not wrong, "\n".join(wrong)


def test_op_definitions_include_no_backend():
    wrong = [f"{rel}: {inc}" for _, rel, _, inc in includes()
             if rel.startswith("executor/ops/") and inc.startswith(("executor/cpu/", "executor/cuda/"))]
    assert not wrong, "\n".join(wrong)


def test_cuda_includes_of_cpu_headers_are_the_known_exceptions():
    found = {(rel, inc) for _, rel, _, inc in includes()
             if rel.startswith("executor/cuda/") and inc.startswith("executor/cpu/")}
    assert found - CUDA_TO_CPU == set(), f"new CUDA -> CPU includes: {sorted(found - CUDA_TO_CPU)}"
    assert CUDA_TO_CPU - found == set(), f"gone, drop them from the list: {sorted(CUDA_TO_CPU - found)}"


def test_core_includes_of_a_backend_are_the_known_exceptions():
    found = {(rel, inc) for _, rel, _, inc in includes()
             if rel.count("/") == 1 and rel.startswith("executor/")
             and inc.startswith(("executor/cpu/", "executor/cuda/"))}
    assert found - CORE_TO_BACKEND == set(), f"new core -> backend includes: {sorted(found - CORE_TO_BACKEND)}"
    assert CORE_TO_BACKEND - found == set(), f"gone, drop them from the list: {sorted(CORE_TO_BACKEND - found)}"


def test_the_checker_sees_includes():
    # Guards the three tests above against passing because the pattern matched nothing.
    seen = {(layer, top) for layer, _, top, _ in includes()}
    assert ("training", "executor") in seen and ("executor", "graph") in seen
    assert ("optimizers", "formulas") in seen and ("executor", "formulas") in seen
