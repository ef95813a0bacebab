"""torch.nn.LSTM / GRU / RNN exported with torch.onnx.export (TorchScript exporter, opset 17, parameters kept as
initializers named as in torch) and differentiated by onnxtrain (issue 24): the outputs, and the gradients of
every parameter and of the inputs (x, h0, c0) for random incoming gradients of every output (output, h_n, c_n),
match torch autograd in float32. The exported graphs hold the ONNX LSTM/GRU/RNN ops (two per model: two layers)
with the torch parameters sliced and concatenated into W, R, B, so this also checks our gate orders against
torch's (GRU exports linear_before_reset=1). `onnxtrain info` on an exported LSTM says it can be trained."""
import subprocess
import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain as ot

CASES = [
    ("LSTM", {}),
    ("GRU", {}),
    ("RNN", {"nonlinearity": "tanh"}),
    ("RNN", {"nonlinearity": "relu"}),
]


def export(module, inputs, names, out_names, path):
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, path, dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          keep_initializers_as_inputs=False, input_names=names, output_names=out_names)
    return onnx.load(path)


def flatten(outs):
    y, state = outs
    return [y] + (list(state) if isinstance(state, tuple) else [state])


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind,kwargs", CASES, ids=[c[0] + "_" + "_".join(c[1].values()) for c in CASES])
def test_matches_torch_autograd(tmp_path, kind, kwargs, batch_first):
    torch.manual_seed(7)
    seq, batch, inp, hidden, layers = 5, 3, 4, 6, 2
    module = getattr(nn, kind)(inp, hidden, num_layers=layers, bidirectional=True, batch_first=batch_first, **kwargs)
    x = torch.randn((batch, seq, inp) if batch_first else (seq, batch, inp))
    h0 = torch.randn(2 * layers, batch, hidden)
    c0 = torch.randn(2 * layers, batch, hidden)
    lstm = kind == "LSTM"
    state = (h0, c0) if lstm else h0
    names = ["x", "h0", "c0"] if lstm else ["x", "h0"]
    out_names = ["y", "hn", "cn"] if lstm else ["y", "hn"]
    model = export(module, (x, state), names, out_names, tmp_path / "m.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(kind) == layers, ops
    params = dict(module.named_parameters())
    assert set(params) <= {i.name for i in model.graph.initializer}

    # torch: outputs and gradients for random incoming gradients of every output.
    leaves = {"x": x.clone().requires_grad_(), "h0": h0.clone().requires_grad_(), "c0": c0.clone().requires_grad_()}
    outs = flatten(module(leaves["x"], (leaves["h0"], leaves["c0"]) if lstm else leaves["h0"]))
    gen = torch.Generator().manual_seed(3)
    dys = [torch.randn(o.shape, generator=gen) for o in outs]
    torch.autograd.backward(outs, dys)
    ref = {k: p.grad.numpy() for k, p in params.items()}
    ref.update({k: leaves[k].grad.numpy() for k in names})

    fb = ot.ForwardBackwardSession(model.SerializeToString(), inputs_requiring_grad=names)
    feeds = {"x": x.numpy(), "h0": h0.numpy(), "c0": c0.numpy()}
    ys = fb.run_forward({k: feeds[k] for k in names})
    for ours, theirs in zip(ys, outs):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = fb.run_backward([d.numpy() for d in dys])
    assert set(ref) <= set(grads)
    for k, v in ref.items():
        scale = np.abs(v).max()
        np.testing.assert_allclose(grads[k], v, rtol=1e-4, atol=1e-5 * scale, err_msg=k)


def test_training_session_trains_exported_lstm(tmp_path, build_dir):
    torch.manual_seed(0)
    module = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    x = torch.randn(4, 6, 3)
    path = tmp_path / "lstm.onnx"
    export(module, (x,), ["x"], ["y", "hn", "cn"], path)
    info = subprocess.run([build_dir / "cli" / "onnxtrain", "info", path], capture_output=True, text=True)
    assert info.returncode == 0, info.stdout + info.stderr
    # A few SGD steps on the exported model lower an MSE loss (the training graph runs end to end).
    s = ot.TrainingSession(str(path), loss="mse", optimizer="sgd", learning_rate=0.5)
    target = np.zeros((4, 6, 5), np.float32)
    losses = [s.train_step({"x": x.numpy(), s.target_name: target}) for _ in range(5)]
    assert losses[-1] < losses[0], losses


# ---- forward values against onnxruntime, for the attributes torch never exports ----------------------------

def one_node(op, d, attrs, with_lens, layout=0, opset=14):
    from onnx import TensorProto, helper
    seq, batch, inp, hidden = 4, 3, 2, 3
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    shapes = {"X": [batch, seq, inp] if layout else [seq, batch, inp], "W": [d, gates * hidden, inp],
              "R": [d, gates * hidden, hidden], "B": [d, 2 * gates * hidden],
              "initial_h": [batch, d, hidden] if layout else [d, batch, hidden]}
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"]
    if op == "LSTM":
        shapes["initial_c"], shapes["P"] = shapes["initial_h"], [d, 3 * hidden]
        names += ["initial_c", "P"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    if with_lens:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [batch]))
    else:
        names[4] = ""
    outs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    attrs = dict(attrs, **({"layout": layout} if layout else {}), **({"direction": "bidirectional"} if d == 2 else {}))
    node = helper.make_node(op, names, outs, hidden_size=hidden, **attrs)
    out_shapes = [[batch, seq, d, hidden] if layout else [seq, d, batch, hidden], shapes["initial_h"], shapes["initial_h"]]
    g = helper.make_graph([node], "g", inputs,
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in zip(outs, out_shapes)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    rng = np.random.default_rng(5)
    feeds = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in shapes.items()}
    if with_lens:
        feeds["sequence_lens"] = np.array([4, 2, 3], np.int32)
    return model, feeds


def ours_forward(model, feeds):
    fb = ot.ForwardBackwardSession(model.SerializeToString(), inputs_requiring_grad=["X"])
    return fb.run_forward(feeds)


ORT_CASES = [
    ("LSTM", 1, {}, True), ("LSTM", 2, {}, True), ("LSTM", 1, {"direction": "reverse"}, True),
    ("LSTM", 1, {"clip": 0.3}, False), ("LSTM", 1, {"input_forget": 1}, True),
    ("LSTM", 2, {"activations": ["HardSigmoid", "Softsign", "Tanh", "Sigmoid", "Relu", "Elu"],
                 "activation_alpha": [0.3, 1.5], "activation_beta": [0.45]}, False),
    ("GRU", 2, {}, True), ("GRU", 1, {"direction": "reverse", "linear_before_reset": 1}, True),
    ("GRU", 1, {"clip": 0.3}, False), ("GRU", 1, {"activations": ["Relu", "LeakyRelu"], "activation_alpha": [0.2]}, True),
    ("RNN", 2, {}, True), ("RNN", 1, {"direction": "reverse", "clip": 0.5}, True),
    ("RNN", 1, {"activations": ["Relu"]}, False),
]


@pytest.mark.parametrize("op,d,attrs,with_lens", ORT_CASES)
def test_forward_matches_onnxruntime(op, d, attrs, with_lens):
    ort = pytest.importorskip("onnxruntime")
    model, feeds = one_node(op, d, attrs, with_lens)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    for i, (a, b) in enumerate(zip(ours_forward(model, feeds), ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout1_is_layout0_transposed(op):
    m0, f0 = one_node(op, 2, {}, True)
    m1, _ = one_node(op, 2, {}, True, layout=1)
    f1 = dict(f0)
    f1["X"] = f0["X"].transpose(1, 0, 2).copy()
    for k in ("initial_h", "initial_c"):
        if k in f0:
            f1[k] = f0[k].transpose(1, 0, 2).copy()
    y0, y1 = ours_forward(m0, f0), ours_forward(m1, f1)
    np.testing.assert_allclose(y1[0], y0[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for a, b in zip(y1[1:], y0[1:]):
        np.testing.assert_allclose(a, b.transpose(1, 0, 2), rtol=1e-6)


# ---- exported gradient graphs: RNNGrad's standard-ONNX body in onnxruntime -----------------------------------

def _export_gradients(model_path, feeds):
    s = ot.TrainingSession(str(model_path), loss="mse")
    rng = np.random.default_rng(4)
    y_shape = s.run_forward(feeds)[0].shape
    feeds = dict(feeds, **{s.target_name: rng.normal(size=y_shape).astype(np.float32)})
    _, native = s.gradients(feeds)
    return s, feeds, native


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_rnn_gradient_graph_runs_in_onnxruntime(tmp_path, kind, with_h0, bidirectional):
    """torch's nn.RNN (tanh), nn.GRU (exported with linear_before_reset=1) and nn.LSTM, one direction or
    bidirectional, two layers: the gradient graph onnxtrain exports carries RNNGrad / GRUGrad / LSTMGrad as functions
    (gradients/fused_recurrent.cpp: a Scan over the directions, each running a reverse Scan, the second direction on
    time-flipped tensors), passes the full checker, and gives in onnxruntime the native kernels' gradients of every
    parameter (torch's bidirectional parameters are per direction: weight_ih_l0 and weight_ih_l0_reverse...);
    without h0 the rule passes zeros."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(5)
    module = getattr(nn, kind)(4, 6, num_layers=2, bidirectional=bidirectional)
    dirs = 2 if bidirectional else 1
    x, h0, c0 = torch.randn(5, 3, 4), torch.randn(2 * dirs, 3, 6), torch.randn(2 * dirs, 3, 6)
    path = tmp_path / "rnn.onnx"
    lstm = kind == "LSTM"
    state = ((h0, c0) if lstm else h0) if with_h0 else None
    names = (["x", "h0", "c0"] if lstm else ["x", "h0"]) if with_h0 else ["x"]
    model = export(module, (x, state) if with_h0 else (x,), names, ["y", "hn", "cn"] if lstm else ["y", "hn"], path)
    directions = {a.s.decode() for n in model.graph.node if n.op_type == kind for a in n.attribute if a.name == "direction"}
    assert directions == ({"bidirectional"} if bidirectional else set()), directions
    values = {"x": x.numpy(), "h0": h0.numpy(), "c0": c0.numpy()}
    feeds = {k: values[k] for k in names}
    s, feeds, native = _export_gradients(path, feeds)
    exported = s.export_gradient_model()
    onnx.checker.check_model(exported, full_check=True)
    assert kind + "Grad" in {f.name for f in exported.functions}
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert len(native) >= 6 * dirs
    for k, v in native.items():
        assert np.abs(v).max() > 0, k
        np.testing.assert_allclose(out[k + "_grad"], v, rtol=1e-4, atol=1e-6 * np.abs(v).max(), err_msg=k)


def test_relu_rnn_gradient_graph_runs_in_onnxruntime(tmp_path):
    """nn.RNN with relu (activations other than the default: the rule writes them as ints and floats beside the
    strings, which the body reads): the exported gradient graph gives the native kernels' gradients in
    onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(6)
    module = nn.RNN(3, 4, nonlinearity="relu", bidirectional=True)
    x = torch.randn(4, 2, 3)
    path = tmp_path / "relu_rnn.onnx"
    export(module, (x,), ["x"], ["y", "hn"], path)
    s, feeds, native = _export_gradients(path, {"x": x.numpy()})
    exported = s.export_gradient_model()
    onnx.checker.check_model(exported, full_check=True)
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert native
    for k, v in native.items():
        assert np.abs(v).max() > 0, k
        np.testing.assert_allclose(out[k + "_grad"], v, rtol=1e-4, atol=1e-6 * np.abs(v).max(), err_msg=k)


@pytest.mark.parametrize("kind,kwargs,served", [("LSTM", {}, True), ("LSTM", {"bidirectional": True}, True),
                                                ("RNN", {"nonlinearity": "relu"}, True)])
def test_checkpoint_carries_a_body_only_where_it_is_right(tmp_path, kind, kwargs, served):
    """A checkpoint's training step carries the fused recurrent grad's function body where the body serves the node
    (an LSTM with one direction or bidirectional, an RNN with relu: every node torch exports); a node the body does
    not serve would get none rather than one that computes something else (the C++ refusal tests name those); all
    resume."""
    torch.manual_seed(7)
    module = getattr(nn, kind)(3, 4, **kwargs)
    x = torch.randn(4, 2, 3)
    path = tmp_path / "rnn.onnx"
    export(module, (x,), ["x"], ["y", "hn", "cn"] if kind == "LSTM" else ["y", "hn"], path)
    s, feeds, _ = _export_gradients(path, {"x": x.numpy()})
    s.train_step(feeds)
    ckpt = tmp_path / "ckpt.onnx"
    s.save_checkpoint(str(ckpt))
    functions = {f.name for f in onnx.load(str(ckpt)).functions}
    assert (kind + "Grad" in functions) == served, functions
    r = ot.TrainingSession.from_checkpoint(str(ckpt))
    assert r.train_step(feeds) == s.train_step(feeds)


@pytest.mark.parametrize("direction,lens", [("reverse", None), ("reverse", [5, 0, 2]), ("forward", [3, 5, 1]),
                                           ("bidirectional", [5, 0, 2])])
@pytest.mark.parametrize("kind,gates,attrs", [("RNN", 1, {}), ("GRU", 3, {"linear_before_reset": 0}),
                                              ("GRU", 3, {"linear_before_reset": 1}), ("LSTM", 4, {})])
def test_one_node_gradient_graph_runs_in_onnxruntime(kind, gates, attrs, direction, lens):
    """direction='reverse' and sequence_lens (which torch never exports): one ONNX node with trainable W, R, B and
    initial_h; the bodies run the same Scans on time-flipped tensors, skip the steps past a row's length (a row of
    length 0 too), and onnxruntime gives the native kernels' gradients."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(9)
    S, B, I, H = 5, 3, 4, 6
    D = 2 if direction == "bidirectional" else 1
    w = rng.uniform(-0.6, 0.6, size=(D, gates * H, I)).astype(np.float32)
    r = rng.uniform(-0.6, 0.6, size=(D, gates * H, H)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, size=(D, 2 * gates * H)).astype(np.float32)
    h0 = rng.normal(size=(D, B, H)).astype(np.float32)
    inits = [numpy_helper.from_array(v, n) for v, n in ((w, "W"), (r, "R"), (b, "B"), (h0, "h0"))]
    if lens:
        inits.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    outs = ["y", "yh"] + (["yc"] if kind == "LSTM" else [])
    node = helper.make_node(kind, ["x", "W", "R", "B", "lens" if lens else "", "h0"], outs, hidden_size=H,
                            direction=direction, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, B, I])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [S, D, B, H])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s = ot.TrainingSession(model.SerializeToString(), loss="mse")
    feeds = {"x": rng.normal(size=(S, B, I)).astype(np.float32),
             s.target_name: rng.normal(size=(S, D, B, H)).astype(np.float32)}
    _, native = s.gradients(feeds)
    exported = s.export_gradient_model()
    onnx.checker.check_model(exported, full_check=True)
    assert kind + "Grad" in {f.name for f in exported.functions}
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert sorted(native) == ["B", "R", "W", "h0"]
    for k, v in native.items():
        assert np.abs(v).max() > 0, k
        np.testing.assert_allclose(out[k + "_grad"], v, rtol=1e-4, atol=1e-6 * np.abs(v).max(), err_msg=k)
    if lens and 0 in lens:  # the spec, not the kernel: a row of length 0 runs no step, so its initial_h gets none
        row = lens.index(0)  # (MSE reads only Y, which is zero on that row whatever h0)
        assert np.all(native["h0"][:, row] == 0) and np.all(out["h0_grad"][:, row] == 0)


@pytest.mark.parametrize("kind,gates,attrs,direction,lens", [
    ("RNN", 1, {"clip": 0.5}, "bidirectional", None),
    ("RNN", 1, {"activations": ["Relu"]}, "forward", None),
    ("RNN", 1, {"activations": ["Softsign", "Relu"], "clip": 0.9}, "bidirectional", [5, 0, 2]),
    ("GRU", 3, {"activations": ["Relu", "LeakyRelu"], "activation_alpha": [0.2], "linear_before_reset": 1}, "reverse",
     [5, 0, 2]),
    ("LSTM", 4, {"activations": ["HardSigmoid", "Softsign", "Tanh", "Sigmoid", "Relu", "Elu"],
                 "activation_alpha": [0.3, 1.5], "activation_beta": [0.45]}, "bidirectional", None),
    ("LSTM", 4, {"activations": ["Sigmoid", "ScaledTanh", "Softplus"], "activation_alpha": [0.9],
                 "activation_beta": [1.1], "clip": 0.6, "input_forget": 1}, "forward", [3, 5, 1]),
    ("GRU", 3, {"clip": 0.4, "linear_before_reset": 0}, "reverse", [5, 0, 2]),
    ("GRU", 3, {"clip": 0.4, "linear_before_reset": 1}, "forward", None),
    ("LSTM", 4, {"clip": 0.5}, "forward", None),
    ("LSTM", 4, {"input_forget": 1}, "bidirectional", [5, 0, 2]),
    ("LSTM", 4, {"clip": 0.4, "input_forget": 1}, "reverse", None),
])
def test_clip_peepholes_input_forget_and_activations_gradients_run_in_onnxruntime(kind, gates, attrs, direction, lens):
    """clip (every gate's pre-activation clipped, no gradient where clipped), LSTM peepholes P and input_forget, and
    activations other than the default (their alpha and beta consumed in order by the functions that take them):
    one ONNX node with trainable W, R, B, initial states and (LSTM) P; the exported gradient graph's bodies give
    in onnxruntime the native kernels' gradients, dP included. (layout 1 is checked against the kernels in C++
    only, FusedBothWays.RecurrentGradsLayout1: onnxruntime's CPU recurrent ops refuse layout 1 themselves.)"""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(11)
    S, B, I, H = 5, 3, 4, 6
    D = 2 if direction == "bidirectional" else 1
    lstm = kind == "LSTM"
    values = {"W": rng.uniform(-0.9, 0.9, size=(D, gates * H, I)), "R": rng.uniform(-0.9, 0.9, size=(D, gates * H, H)),
              "B": rng.uniform(-0.5, 0.5, size=(D, 2 * gates * H)), "h0": rng.normal(size=(D, B, H))}
    if lstm:
        values["c0"] = rng.normal(size=(D, B, H))
        values["P"] = rng.uniform(-0.8, 0.8, size=(D, 3 * H))
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in values.items()]
    if lens:
        inits.append(numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    ins = ["x", "W", "R", "B", "lens" if lens else "", "h0"] + (["c0", "P"] if lstm else [])
    outs = ["y", "yh"] + (["yc"] if lstm else [])
    node = helper.make_node(kind, ins, outs, hidden_size=H, direction=direction, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, B, I])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [S, D, B, H])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s = ot.TrainingSession(model.SerializeToString(), loss="mse")
    feeds = {"x": rng.normal(size=(S, B, I)).astype(np.float32),
             s.target_name: rng.normal(size=(S, D, B, H)).astype(np.float32)}
    _, native = s.gradients(feeds)
    exported = s.export_gradient_model()
    onnx.checker.check_model(exported, full_check=True)
    grad_nodes = [n for n in exported.graph.node if n.op_type == kind + "Grad"]
    assert grad_nodes and kind + "Grad" in {f.name for f in exported.functions}
    if "clip" in attrs:  # the rule writes the clip beside it for the body, which cannot read an optional attribute
        assert {a.name: a.f for a in grad_nodes[0].attribute}["clip_bound"] == pytest.approx(attrs["clip"])
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert sorted(native) == sorted(values)
    for k, v in native.items():
        assert np.abs(v).max() > 0, k
        np.testing.assert_allclose(out[k + "_grad"], v, rtol=1e-4, atol=1e-6 * np.abs(v).max(), err_msg=k)
