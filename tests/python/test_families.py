"""Issue 27, "one home per op": an op's gradient rule (gradients/rules/<family>.cpp), CPU kernels
(executor/cpu/<family>.cpp) and CUDA kernels (executor/cuda/<family>.cu) live under one family name, and no
family is a catch-all. The table is docs/executor.md, "Families". Read from the sources, so no build is needed."""
import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = {
    "rules": ("gradients/rules", ".cpp", r"void register_(\w+)_rules\(GradientRegistry& \w+\) \{"),
    "cpu": ("executor/cpu", ".cpp", r"void register_cpu_(\w+)\(KernelRegistry& \w+\) \{"),
    "cuda": ("executor/cuda", ".cu", r"void register_cuda_(\w+)\(KernelRegistry& \w+\) \{"),
}
# Files that widen other families' kernels to float16/bfloat16 rather than being a family.
VARIANTS = {"half_matmul"}
# Registration that is no op family: the CPU's plan passes (docs/executor.md).
NOT_FAMILIES = {"fusion_pass"}
# A registration: the op's name as the first string of an add/twin/add_reduce/register_select call (after the
# registry and an optional domain), or in a `for (const char* op : {...})` list. Ops registered from a table of
# structs (the Reduce* ops) are not seen; their files agree today.
CALL = re.compile(r'\b(?:add|twin|add_reduce|register_select)\((?:\w+, )?(?:"onnxtrain", )?"([A-Z]\w*)"')
LOOP = re.compile(r"for \(const char\* op : \{([^}]*)\}\)")

# Ops whose files are still named differently in some layer (issue 27). Shrink this list; do not grow it. Empty
# since issue 27 aligned the trigonometric ops, the activations and the fused activation gradients; the check
# below still fails for an op listed here once it is aligned, so a future entry cannot go stale.
KNOWN_MISMATCHES = set()
# Fused gradient ops (the "onnxtrain" domain: ReluGrad, SoftmaxGrad, ConvGrad, ...) have no rule of their own: the
# forward op's rule emits them. Their home is that rule's family, like the forward op's kernels, so the emitting rule
# file counts as their "rules" layer (a string literal "...Grad" naming the op anywhere in a rules family's file). The
# exception are kernel families that have no rules file at all: helper ops several rules share (gather_grad:
# GatherGrad and SumToShape, emitted by the Gather rule and the broadcasting helper in rules/util.cpp) or ops no rule
# emits (training_ops); those are families of their own (docs/executor.md, "Families", a dash in the rule column).
EMITTED = re.compile(r'"([A-Z]\w*Grad)"')


def registrations():
    """op -> {layer: {family}}, from each layer's register functions; a fused gradient op without a rule of its own
    gets the family of the rules file that emits it as its "rules" layer (see EMITTED)."""
    where = collections.defaultdict(lambda: collections.defaultdict(set))
    emitted = collections.defaultdict(set)
    for layer, (folder, ext, signature) in LAYERS.items():
        for path in sorted((ROOT / folder).glob("*" + ext)):
            text = path.read_text()
            if path.stem in NOT_FAMILIES:
                continue
            for m in re.finditer(signature, text):
                family = m.group(1)
                assert family == path.stem, f"{path}: register function of family '{family}' in file '{path.stem}'"
                if family in VARIANTS:
                    continue
                body = text[m.end():text.find("\n}", m.end())]
                ops = set(CALL.findall(body))
                for lst in LOOP.findall(body):
                    ops |= set(re.findall(r'"([A-Z]\w*)"', lst))
                for op in ops:
                    where[op][layer].add(family)
                if layer == "rules":  # the whole file: rules emit fused ops from helpers too (conv.cpp)
                    for op in EMITTED.findall(text):
                        emitted[op].add(family)
    rule_families = {p.stem for p in (ROOT / LAYERS["rules"][0]).glob("*.cpp")}
    for op, families in emitted.items():
        layers = where.get(op)
        if not layers or "rules" in layers:
            continue  # not a kernel, or an op with a rule of its own
        kernel_families = set().union(*layers.values())
        if kernel_families & rule_families:
            layers["rules"] |= families
    return where


def test_no_catch_all_family():
    for folder, ext, _ in LAYERS.values():
        assert not (ROOT / folder / ("misc" + ext)).exists(), f"{folder}/misc{ext}: give each op a family"


def test_registrations_are_found():
    where = registrations()
    # A few ops of every layer, so a parser that finds nothing cannot pass the test below.
    for op, layers in {"Einsum": {"rules", "cpu", "cuda"}, "Pad": {"rules", "cpu", "cuda"},
                       "TopK": {"rules", "cpu", "cuda"}, "DropoutMask": {"cpu", "cuda"}}.items():
        assert set(where[op]) == layers, (op, dict(where[op]))
    # Fused gradients take the emitting rule's family (EMITTED), except the shared helpers' own family.
    for op, family in {"ReluGrad": "unary", "GeluGrad": "activation", "SoftmaxGrad": "softmax",
                       "ConvGrad": "conv", "MaxPoolGrad": "pool"}.items():
        assert where[op]["rules"] == {family}, (op, dict(where[op]))
    assert "rules" not in where["GatherGrad"], dict(where["GatherGrad"])


def test_each_op_has_one_family_name():
    where = registrations()
    split = {}
    for op, layers in where.items():
        families = set().union(*layers.values())
        if len(families) > 1:
            split[op] = {layer: sorted(f) for layer, f in layers.items()}
    unexpected = {op: v for op, v in split.items() if op not in KNOWN_MISMATCHES}
    assert not unexpected, f"ops whose rule and kernels are in differently named files: {unexpected}"
    aligned = sorted(op for op in KNOWN_MISMATCHES if op not in split)
    assert not aligned, f"aligned now; remove from KNOWN_MISMATCHES: {aligned}"
