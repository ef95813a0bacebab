"""The spatial ops' gradients (issue 24) against torch autograd: GridSample (every mode, padding and
align_corners; gradients of the input and the grid), Col2Im (F.fold), MaxUnpool (F.max_unpool2d, with and
without output_shape) and LpPool (F.lp_pool2d / lp_pool1d). Each case is a one-node ONNX model in float64 run by
onnxtrain's ForwardBackwardSession, fed a random output gradient; torch computes the same vector-Jacobian
product. The forward values are compared too."""
import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import onnxtrain as ot

D = TensorProto.DOUBLE


def one_node_model(node, inputs, out_shape, opset, initializers=()):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, D, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", D, out_shape)], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model, feeds, wrt, dy):
    fb = ot.ForwardBackwardSession(model.SerializeToString(), inputs_requiring_grad=wrt)
    (y,) = fb.run_forward(feeds)
    return y, fb.run_backward([dy])


def torch_vjp(fn, tensors, dy):
    ts = [torch.tensor(t, requires_grad=True) for t in tensors]
    y = fn(*ts)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


def close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10, err_msg=what)


# Bicubic differs from torch outside [-1, 1]: the ONNX reference pads the sampling coordinate itself before
# taking taps, torch only the taps; inside, both are the same function, so the cubic grids stay inside.
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_torch(mode, padding, align):
    rng = np.random.default_rng(hash((mode, padding, align)) % 2**32)
    x = rng.normal(size=(2, 3, 5, 6))
    reach = 1.0 if mode == "bicubic" else 1.6
    grid = rng.uniform(-reach, reach, size=(2, 4, 3, 2))
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    model = one_node_model(node, [("x", x.shape), ("grid", grid.shape)], [2, 3, 4, 3], 16)
    dy = rng.normal(size=(2, 3, 4, 3))
    y, g = run(model, {"x": x, "grid": grid}, ["x", "grid"], dy)
    ty, (tx, tg) = torch_vjp(
        lambda a, b: F.grid_sample(a, b, mode=mode, padding_mode=padding, align_corners=bool(align)), [x, grid], dy)
    close(y, ty, "Y")
    close(g["x"], tx, "dX")
    close(g["grid"], tg, "dGrid")  # zero for nearest, in torch as here


def test_grid_sample_volumetric_matches_torch():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 2, 3, 4, 5))
    grid = rng.uniform(-1.4, 1.4, size=(1, 2, 3, 2, 3))
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="linear", padding_mode="reflection")
    model = one_node_model(node, [("x", x.shape), ("grid", grid.shape)], [1, 2, 2, 3, 2], 20)
    dy = rng.normal(size=(1, 2, 2, 3, 2))
    y, g = run(model, {"x": x, "grid": grid}, ["x", "grid"], dy)
    ty, (tx, tg) = torch_vjp(lambda a, b: F.grid_sample(a, b, padding_mode="reflection", align_corners=False),
                             [x, grid], dy)
    close(y, ty, "Y")
    close(g["x"], tx, "dX")
    close(g["grid"], tg, "dGrid")


@pytest.mark.parametrize("image,block,attrs", [
    ((4, 5), (2, 2), {}),
    ((5, 6), (2, 3), {"pads": [1, 0, 1, 2], "strides": [2, 1], "dilations": [1, 2]}),
])
def test_col2im_matches_fold(image, block, attrs):
    rng = np.random.default_rng(7)
    pads = attrs.get("pads", [0, 0, 0, 0])
    strides, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    blocks = [(image[i] + pads[i] + pads[i + 2] - (block[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(2)]
    x = rng.normal(size=(2, 3 * block[0] * block[1], blocks[0] * blocks[1]))
    node = helper.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"], **attrs)
    inits = [helper.make_tensor("image_shape", TensorProto.INT64, [2], list(image)),
             helper.make_tensor("block_shape", TensorProto.INT64, [2], list(block))]
    model = one_node_model(node, [("x", x.shape)], [2, 3, *image], 18, inits)
    dy = rng.normal(size=(2, 3, *image))
    y, g = run(model, {"x": x}, ["x"], dy)
    # torch's fold pads symmetrically: pad the image by the larger pads and crop, which is what Col2Im's
    # asymmetric pads mean.
    big = [image[0] + pads[0] + pads[2], image[1] + pads[1] + pads[3]]

    def fold(t):
        full = F.fold(t, big, block, dilation=dil, padding=0, stride=strides)
        return full[:, :, pads[0]:pads[0] + image[0], pads[1]:pads[1] + image[1]]

    ty, (tx,) = torch_vjp(fold, [x], dy)
    close(y, ty, "Y")
    close(g["x"], tx, "dX")


@pytest.mark.parametrize("output_shape", [None, (7, 9)])
def test_max_unpool_matches_torch(output_shape):
    rng = np.random.default_rng(11)
    src = torch.tensor(rng.normal(size=(2, 3, 6, 8)))
    pooled, idx = F.max_pool2d(src, 2, 2, return_indices=True)  # torch's indices are per plane
    x = pooled.numpy()
    # ONNX's indices run over the whole [N, C, H, W] tensor.
    plane = torch.arange(2 * 3).reshape(2, 3, 1, 1) * (6 * 8)
    onnx_idx = (idx + plane).numpy().astype(np.int64)
    inputs = ["x", "i"] + (["output_shape"] if output_shape else [])
    node = helper.make_node("MaxUnpool", inputs, ["y"], kernel_shape=[2, 2], strides=[2, 2])
    inits = [helper.make_tensor("i", TensorProto.INT64, onnx_idx.shape, onnx_idx.ravel().tolist())]
    out = [2, 3, *(output_shape or (6, 8))]
    if output_shape:
        inits.append(helper.make_tensor("output_shape", TensorProto.INT64, [4], out))
    model = one_node_model(node, [("x", x.shape)], out, 11, inits)
    dy = rng.normal(size=out)
    y, g = run(model, {"x": x}, ["x"], dy)
    # With output_shape, ONNX keeps the unpooled [6, 8] block in the corner (indices refer to it); torch's
    # output_size re-reads the indices in the larger plane, so compare with torch on [6, 8] and zero-pad.
    ty, (tx,) = torch_vjp(lambda t: F.max_unpool2d(t, idx, 2, 2, output_size=(6, 8)), [x], dy[:, :, :6, :8])
    expect = np.zeros(out)
    expect[:, :, :6, :8] = ty
    close(y, expect, "Y")
    close(g["x"], tx, "dX")


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("kernel,stride", [((2, 2), (2, 2)), ((3, 2), (1, 2))])
def test_lp_pool2d_matches_torch(p, kernel, stride):
    rng = np.random.default_rng(p * 10 + kernel[0])
    x = rng.normal(size=(2, 3, 6, 7))
    # torch pools x^p, ONNX |x|^p: the same for even p; for odd p the inputs are kept positive (the negative
    # side is the float64 gradient check's, tests/gradients/rule_cases_spatial.cpp).
    x = np.abs(x) + 0.1 if p % 2 else x
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=list(kernel), strides=list(stride), p=p)
    dy_shape = [2, 3, (6 - kernel[0]) // stride[0] + 1, (7 - kernel[1]) // stride[1] + 1]
    dy = rng.normal(size=dy_shape)
    model = one_node_model(node, [("x", x.shape)], dy_shape, 18)
    y, g = run(model, {"x": x}, ["x"], dy)
    ty, (tx,) = torch_vjp(lambda t: F.lp_pool2d(t, p, kernel, stride), [x], dy)
    # torch computes sign(x) relu(|x|)^p through avg_pool * kernel size, so it matches to rounding only.
    np.testing.assert_allclose(y, ty, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(g["x"], tx, rtol=1e-7, atol=1e-9)


def test_global_lp_pool_matches_torch():
    rng = np.random.default_rng(3)
    x = np.abs(rng.normal(size=(2, 3, 4, 5))) + 0.1  # positive: torch pools x^3, ONNX |x|^3
    node = helper.make_node("GlobalLpPool", ["x"], ["y"], p=3)
    model = one_node_model(node, [("x", x.shape)], [2, 3, 1, 1], 18)
    dy = rng.normal(size=(2, 3, 1, 1))
    y, g = run(model, {"x": x}, ["x"], dy)
    ty, (tx,) = torch_vjp(lambda t: F.lp_pool2d(t, 3, (4, 5)), [x], dy)
    np.testing.assert_allclose(y, ty, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(g["x"], tx, rtol=1e-7, atol=1e-9)


# Forward values where torch has no twin: onnxruntime is the oracle (MaxRoiPool has no ONNX node test, and the
# LpPool node tests do not combine pads, ceil_mode and dilations).
def ort_run(model, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_max_roi_pool_matches_onnxruntime():
    rng = np.random.default_rng(13)
    x = rng.normal(size=(2, 3, 9, 11)).astype(np.float32)
    rois = np.array([[0, 0.4, 1.2, 7.6, 5.1], [1, 3.5, 2.5, 10.2, 8.9], [1, 2, 2, 2, 2], [0, 6, 1, 30, 4]],
                    dtype=np.float32)
    node = helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[3, 2], spatial_scale=0.8)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                      helper.make_tensor_value_info("rois", TensorProto.FLOAT, rois.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    want = ort_run(model, {"x": x, "rois": rois})
    got = ot.ForwardBackwardSession(model.SerializeToString()).run_forward({"x": x, "rois": rois})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "p": 3},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [1, 2]},
    {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "p": 1},
])
def test_lp_pool_matches_onnxruntime(attrs):
    rng = np.random.default_rng(17)
    x = rng.normal(size=(2, 2, 7, 8)).astype(np.float32)
    node = helper.make_node("LpPool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    want = ort_run(model, {"x": x})
    graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, want.shape))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    got = ot.ForwardBackwardSession(model.SerializeToString()).run_forward({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class AffineSampler(torch.nn.Module):
    """A spatial transformer: a learned affine map of a fixed base grid, sampled with F.grid_sample, then a conv.
    (The base grid is a buffer: affine_grid itself exports only at opset 20.)"""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor([[1.1, 0.2, 0.05], [-0.1, 0.9, 0.1]]))
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        base = F.affine_grid(torch.eye(2, 3).unsqueeze(0), [1, 1, 6, 5], align_corners=False).reshape(-1, 2)
        self.register_buffer("base", torch.cat([base, torch.ones(30, 1)], 1))

    def forward(self, x):
        grid = (self.base @ self.theta.t()).reshape(1, 6, 5, 2).expand(x.shape[0], 6, 5, 2)
        return self.conv(F.grid_sample(x, grid, padding_mode="border", align_corners=False))


def test_torch_module_learning_its_sampling_grid_matches_torch():
    """The whole path of a torch user: export (GridSample at opset 17), the grid's gradient flowing back into the
    affine parameters, and the input's gradient."""
    import copy

    import onnxtrain.torch as ott

    torch.manual_seed(0)
    eager = AffineSampler().train()
    wrapped = ott.TrainModule(copy.deepcopy(eager))
    x, target = torch.randn(2, 2, 6, 5), torch.randn(2, 3, 6, 5)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    for m, xi in zip((eager, wrapped), xs):
        ((m(xi) - target) ** 2).mean().backward()

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    for (name, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        assert q.grad is not None, name
        assert rel(q.grad, p.grad) < 1e-5, name
    assert rel(xs[1].grad, xs[0].grad) < 1e-5


# ---- exported gradient graphs: the fused gradients' standard-ONNX bodies in onnxruntime -----------------------

def exported_gradients_in_ort(model, feeds, target):
    """The loss gradient graph onnxtrain exports for `model` (trainable: its initializers): it must pass the
    full checker and carry its fused ops as functions; returns (onnxtrain's native gradients, onnxruntime's
    run of the export, the function names)."""
    import onnxruntime as ort
    s = ot.TrainingSession(model.SerializeToString(), loss="mse")
    feeds = dict(feeds, **{s.target_name: target})
    _, native = s.gradients(feeds)
    exported = s.export_gradient_model()
    onnx.checker.check_model(exported, full_check=True)
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, feeds)))
    return native, {k: out[k + "_grad"] for k in native}, {f.name for f in exported.functions}


@pytest.mark.parametrize("opset", [13, 17, 20])
def test_max_roi_pool_gradient_graph_runs_in_onnxruntime(opset):
    """MaxRoiPoolGrad's body (gradients/fused_spatial.cpp) in onnxruntime gives the native kernel's gradient:
    overlapping regions, ties (few distinct values), a region past the image and rounding halves."""
    rng = np.random.default_rng(19)
    w = (rng.integers(-3, 4, size=(2, 3, 9, 11)) * 0.25).astype(np.float32)
    rois = np.array([[0, 1, 3, 9, 11], [1, 5, 1, 13, 7], [0, 0.4, 1.2, 7.6, 5.1], [1, 6, 1, 30, 4],
                     [0, 1, 3, 9, 11]], dtype=np.float32)
    node = helper.make_node("MaxRoiPool", ["w", "rois"], ["y"], pooled_shape=[3, 2], spatial_scale=0.5)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("rois", TensorProto.FLOAT, rois.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3, 3, 2])],
        initializer=[onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    target = rng.normal(size=(5, 3, 3, 2)).astype(np.float32)
    native, ort_grads, functions = exported_gradients_in_ort(model, {"rois": rois}, target)
    assert "MaxRoiPoolGrad" in functions
    assert np.count_nonzero(native["w"]) > 10
    np.testing.assert_allclose(ort_grads["w"], native["w"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_gradient_graph_runs_in_onnxruntime(mode, padding, align):
    """GridSampleGrad's body (gradients/fused_spatial.cpp) in onnxruntime gives the native kernel's gradients of
    both X and the grid (every weight trainable), grids reaching past [-1, 1]. The exported graph's forward
    GridSample runs in onnxruntime too, whose bicubic pads the taps, not the coordinate, outside [-1, 1] (as torch
    does, unlike the ONNX reference and our kernel): the cubic grids stay inside, so that dY agrees."""
    rng = np.random.default_rng(hash((mode, padding, align, 1)) % 2**32)
    x = rng.normal(size=(2, 3, 5, 6)).astype(np.float32)
    reach = 1.0 if mode == "bicubic" else 1.6
    grid = rng.uniform(-reach, reach, size=(2, 4, 3, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 3])],
                              initializer=[onnx.numpy_helper.from_array(x, "x"),
                                           onnx.numpy_helper.from_array(grid, "grid")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    target = rng.normal(size=(2, 3, 4, 3)).astype(np.float32)
    native, ort_grads, functions = exported_gradients_in_ort(model, {}, target)
    assert "GridSampleGrad" in functions
    for k in ("x", "grid"):
        if not (mode == "nearest" and k == "grid"):
            assert np.abs(native[k]).max() > 0, k
        np.testing.assert_allclose(ort_grads[k], native[k], rtol=1e-5, atol=1e-6, err_msg=k)


# onnxruntime's GridSample has no cubic mode for 3-D sampling (its forward refuses it); the body's cubic 3-D
# case is checked against the kernel in tests/gradients/test_fused_both_ways.cpp.
@pytest.mark.parametrize("mode,padding", [("linear", "reflection"), ("linear", "border"), ("nearest", "zeros")])
def test_volumetric_grid_sample_gradient_graph_runs_in_onnxruntime(mode, padding):
    """The same at opset 20 for 3-D sampling (X [N, C, D, H, W], grid [N, d, h, w, 3])."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(23)
    x = rng.normal(size=(1, 2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.4, 1.4, size=(1, 2, 3, 2, 3)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 3, 2])],
                              initializer=[onnx.numpy_helper.from_array(x, "x"),
                                           onnx.numpy_helper.from_array(grid, "grid")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    target = rng.normal(size=(1, 2, 2, 3, 2)).astype(np.float32)
    try:
        native, ort_grads, functions = exported_gradients_in_ort(model, {}, target)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented as e:  # an onnxruntime without 3-D GridSample
        pytest.skip(str(e))
    assert "GridSampleGrad" in functions
    for k in ("x", "grid"):
        np.testing.assert_allclose(ort_grads[k], native[k], rtol=1e-5, atol=1e-6, err_msg=k)
