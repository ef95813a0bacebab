"""Gradients of Shrink, LpNormalization, LRN and MeanVarianceNormalization (issue 24) against torch autograd:
one-node float64 ONNX models differentiated by onnxtrain's ForwardBackwardSession, the same maths through torch's
own ops (F.hardshrink/softshrink, F.normalize, F.local_response_norm) or, for MVN (torch has no such op), its
ONNX definition written in torch."""
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import onnxtrain as ot


def one_node(op, shape, opset, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(shape))
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def ours(model, x, dy):
    fb = ot.ForwardBackwardSession(model.SerializeToString(), inputs_requiring_grad=["x"])
    (y,) = fb.run_forward({"x": x})
    return y, fb.run_backward([dy])["x"]


def torch_ref(fn, x, dy):
    t = torch.tensor(x, requires_grad=True)
    y = fn(t)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), t.grad.numpy()


def check(model, fn, x, seed=1):
    out_shape = fn(torch.tensor(x)).shape  # x's shape except for Det
    dy = np.random.default_rng(seed).standard_normal(tuple(out_shape))
    y, dx = ours(model, x, dy)
    ry, rdx = torch_ref(fn, x, dy)
    np.testing.assert_allclose(y, ry, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, rdx, rtol=1e-9, atol=1e-12)
    assert np.abs(rdx).max() > 0  # a zero gradient would agree vacuously


def away_from(x, points, gap=0.05):
    """x with entries within `gap` of a kink moved off it (finite-sample ties would make autograd pick a side)."""
    for p in points:
        near = np.abs(x - p) < gap
        x[near] += 2 * gap
    return x


@pytest.mark.parametrize("lambd", [0.5, 1.0])
def test_shrink_hard(lambd):
    x = away_from(np.random.default_rng(0).uniform(-2, 2, (4, 5)), [-lambd, lambd])
    check(one_node("Shrink", x.shape, 17, lambd=lambd), lambda t: F.hardshrink(t, lambd), x)


def test_shrink_soft():
    lambd = 0.75  # softshrink is Shrink with bias = lambd (values exact in float32: ONNX float attributes)
    x = away_from(np.random.default_rng(2).uniform(-2, 2, (3, 6)), [-lambd, lambd])
    check(one_node("Shrink", x.shape, 17, lambd=lambd, bias=lambd), lambda t: F.softshrink(t, lambd), x)


@pytest.mark.parametrize("p,axis", [(2, -1), (2, 1), (1, 0), (1, -1)])
def test_lp_normalization(p, axis):
    x = np.random.default_rng(3).uniform(-2, 2, (3, 4, 5))
    if p == 1:
        x = away_from(x, [0.0])
    # F.normalize clamps the norm at eps from below; with norms of order 1 that changes nothing.
    check(one_node("LpNormalization", x.shape, 17, p=p, axis=axis), lambda t: F.normalize(t, p=p, dim=axis), x)


# torch pads the channel window with size // 2 before c and (size - 1) // 2 after it; ONNX takes
# floor((size - 1) / 2) before and ceil((size - 1) / 2) after. They agree for odd sizes only, so only odd
# sizes are compared (even sizes are covered by the central-difference check in rule_cases_normalization.cpp).
@pytest.mark.parametrize("size,shape", [(3, (2, 5, 3, 3)), (5, (2, 7, 4)), (1, (1, 3, 2, 2))])
def test_lrn(size, shape):
    alpha, beta, k = 0.25, 0.75, 1.5  # exact in float32, the type of ONNX float attributes
    x = np.random.default_rng(4).uniform(-2, 2, shape)
    m = one_node("LRN", shape, 13, size=size, alpha=alpha, beta=beta, bias=k)
    check(m, lambda t: F.local_response_norm(t, size, alpha=alpha, beta=beta, k=k), x)


@pytest.mark.parametrize("axes,shape,opset", [(None, (2, 3, 4, 2), 9), ([2], (2, 3, 4), 13), ([0, 2], (3, 2, 4), 13)])
def test_mean_variance_normalization(axes, shape, opset):
    dims = [0, 2, 3] if axes is None else axes

    def mvn(t):  # the schema's body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)
        m = t.mean(dim=dims, keepdim=True)
        return (t - m) / ((t * t).mean(dim=dims, keepdim=True) - m * m).sqrt().add(1e-9)

    x = np.random.default_rng(5).uniform(-2, 2, shape)
    attrs = {} if axes is None else {"axes": axes}
    check(one_node("MeanVarianceNormalization", shape, opset, **attrs), mvn, x)


def det_model(shape, opset=13):
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(shape[:-2]))
    g = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (5, 2, 2), (1, 1)])
def test_det(shape):
    x = np.random.default_rng(6).uniform(-2, 2, shape)
    check(det_model(shape), torch.linalg.det, x)


@pytest.mark.parametrize(
    "a,cof",
    [
        # rank 1: the cofactor matrix [[d, -c], [-b, a]]
        ([[1.0, 2.0], [2.0, 4.0]], [[4.0, -2.0], [-2.0, 1.0]]),
        # rank 2: cofactors worked out by hand (each a signed 2x2 minor)
        ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], [[-3.0, 6.0, -3.0], [6.0, -12.0, 6.0], [-3.0, 6.0, -3.0]]),
    ],
)
def test_det_gradient_at_singular_matrices_is_the_cofactor_matrix(a, cof):
    # d det / dA is the cofactor matrix everywhere, singular A included (there det * inverse^T does not exist).
    a = np.array(a)
    y, dx = ours(det_model(a.shape), a, np.array(1.0))
    assert y == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(dx, np.array(cof), atol=1e-12)


def with_constant_input(op, x_shape, y_shape, const, opset, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(y_shape))
    c = onnx.numpy_helper.from_array(const, "c")
    g = helper.make_graph([helper.make_node(op, ["x", "c"], ["y"], **attrs)], "g", [x], [y], [c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("axis", [0, -1, None])
def test_compress_is_index_select(axis):
    x = np.random.default_rng(7).uniform(-2, 2, (4, 5))
    cond = np.array([True, False, True, True])  # shorter than both axes: the rest counts as false
    kept = torch.tensor(np.flatnonzero(cond))
    attrs = {} if axis is None else {"axis": axis}
    out = (len(kept),) if axis is None else tuple(len(kept) if d == (axis % 2) else n for d, n in enumerate(x.shape))
    m = with_constant_input("Compress", x.shape, out, cond, 11, **attrs)
    ref = (lambda t: t.reshape(-1).index_select(0, kept)) if axis is None else (lambda t: t.index_select(axis, kept))
    check(m, ref, x)


def test_center_crop_pad_is_a_centred_pad():
    # Axis 0: 5 -> 2 (crop 1 before, 2 after); axis 2: 3 -> 6 (pad 1 before, 2 after); axis 1 unchanged.
    x = np.random.default_rng(8).uniform(-2, 2, (5, 2, 3))
    m = with_constant_input("CenterCropPad", x.shape, (2, 2, 6), np.array([2, 2, 6], np.int64), 18)
    check(m, lambda t: F.pad(t, (1, 2, 0, 0, -1, -2)), x)


@pytest.mark.parametrize("op,shape,attrs", [("LRN", (2, 4, 3), {"size": 3, "alpha": 0.5}), ("Det", (2, 3, 3), {}),
                                            ("LpNormalization", (3, 4), {"p": 1})])
def test_float32_gradients_match_float64(op, shape, attrs):
    # The rules' constants (LRN's band matrix, Det's signs) follow the input's dtype.
    x64 = np.random.default_rng(9).uniform(0.5, 2, shape)
    out = shape[:-2] if op == "Det" else shape
    dy = np.random.default_rng(10).standard_normal(out)

    def grads(dtype, t):
        xi = helper.make_tensor_value_info("x", t, list(shape))
        yi = helper.make_tensor_value_info("y", t, list(out))
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [xi], [yi])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        return ours(m, x64.astype(dtype), dy.astype(dtype))[1]

    np.testing.assert_allclose(grads(np.float32, TensorProto.FLOAT), grads(np.float64, TensorProto.DOUBLE), rtol=2e-4, atol=1e-5)


def weighted(op, x_shape, y_shape, opset, const=None, **attrs):
    """y = op(x * w) in float32 with a trained weight w, for the exported gradient model."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    w = onnx.numpy_helper.from_array(np.random.default_rng(11).uniform(0.5, 1.5, x_shape[-1:]).astype(np.float32), "w")
    inits, ins = [w], ["xw"]
    if const is not None:
        inits.append(onnx.numpy_helper.from_array(const, "c"))
        ins.append("c")
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node(op, ins, ["y"], **attrs)]
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "op,x_shape,y_shape,opset,const,attrs",
    [
        ("Shrink", (3, 4), (3, 4), 17, None, {"lambd": 0.25, "bias": 0.125}),
        ("LpNormalization", (3, 4), (3, 4), 17, None, {"p": 2}),
        ("MeanVarianceNormalization", (2, 3, 4), (2, 3, 4), 13, None, {"axes": [0, 2]}),
        ("LRN", (2, 4, 2, 3), (2, 4, 2, 3), 13, None, {"size": 3, "alpha": 0.5}),  # onnxruntime's LRN is 4-D only
        ("Det", (2, 3, 3), (2,), 13, None, {}),
        ("CenterCropPad", (4, 3), (2, 5), 18, np.array([2, 5], np.int64), {}),
        # Opset 13: an opset 11 model's exported gradient model imports opset 13 (the MSE loss's) while the
        # engine's broadcast sum for Mul keeps opset 11's ReduceSum(axes=...) attribute, which the checker refuses.
        ("Compress", (4, 3), (2, 3), 13, np.array([False, True, False, True]), {"axis": 0}),
    ],
)
def test_onnxruntime_runs_the_gradient_graph(op, x_shape, y_shape, opset, const, attrs):
    # The backward graph is standard ONNX (no onnxtrain op): onnx's full checker accepts it, and onnxruntime
    # runs it to the gradient our executor computes.
    import onnxruntime as ort

    s = ot.TrainingSession(weighted(op, x_shape, y_shape, opset, const, **attrs), loss="mse")
    rng = np.random.default_rng(12)
    x = rng.uniform(-2, 2, x_shape).astype(np.float32)
    target = rng.standard_normal(y_shape).astype(np.float32)
    _, grads = s.gradients({"x": x, s.target_name: target})
    gm = s.export_gradient_model()
    assert all(n.domain in ("", "ai.onnx") for n in gm.graph.node), [n.op_type for n in gm.graph.node if n.domain]
    onnx.checker.check_model(gm, full_check=True)
    sess = ort.InferenceSession(gm.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: (target if i.name == s.target_name else x) for i in sess.get_inputs()}
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    np.testing.assert_allclose(outs["w_grad"], grads["w"], rtol=1e-4, atol=1e-6)
    assert np.abs(grads["w"]).max() > 0
