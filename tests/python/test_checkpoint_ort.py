"""A trainable checkpoint written by the C++ example is standard ONNX: the full checker accepts it, its
training_info follows the ONNX IR rules for bindings, and onnxruntime (which ignores training_info) predicts
exactly what onnxtrain's own `infer` predicted."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import ROOT


@pytest.fixture(scope="module", params=[["--optimizer", "adam", "--lr", "0.001"],
                                        ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01"]],
                ids=["adam", "sgd_momentum"])
def trained(request, tmp_path_factory, build_dir):
    d = tmp_path_factory.mktemp("ckpt")
    model = d / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", model, "--sizes", "16", "32", "1"],
                   check=True, capture_output=True)
    subprocess.run([build_dir / "examples" / "train_mlp", model, "--epochs", "2", "--samples", "256", "--batch", "32",
                    "--checkpoint", d / "ck.onnx", "--dump", d, *request.param],
                   check=True, capture_output=True, text=True)
    return d


def test_checkpoint_passes_full_check(trained):
    m = onnx.load(trained / "ck.onnx")
    onnx.checker.check_model(m, full_check=True)
    assert len(m.training_info) == 1


def test_bindings_follow_the_onnx_ir_rules(trained):
    m = onnx.load(trained / "ck.onnx")
    ti = m.training_info[0]
    main_inits = {t.name for t in m.graph.initializer}
    alg_inits = {t.name for t in ti.algorithm.initializer}
    alg_outputs = {o.name for o in ti.algorithm.output}
    keys = [e.key for e in ti.update_binding]
    assert len(keys) == len(set(keys)), "update_binding keys must be unique"
    for e in ti.update_binding:  # keys: initializers of the main graph or the algorithm; values: its outputs
        assert e.key in main_inits | alg_inits, e.key
        assert e.value in alg_outputs, e.value
    assert main_inits <= set(keys), "every weight is updated by the training step"
    assert "optim.step" in keys
    init_outputs = {o.name for o in ti.initialization.output}
    assert len(ti.initialization.input) == 0
    for e in ti.initialization_binding:
        assert e.key in alg_inits and e.value in init_outputs, (e.key, e.value)
    # The algorithm must not redefine anything of the main graph (the two are concatenated).
    main_values = {o for n in m.graph.node for o in n.output} | main_inits | {i.name for i in m.graph.input}
    for n in ti.algorithm.node:
        assert not main_values & set(n.output), n.name
    assert not main_inits & alg_inits
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["onnxtrain.format"] == "1" and meta["onnxtrain.version"]
    assert int(meta["onnxtrain.step"]) == 16  # 2 epochs of 256 / 32


def test_onnxruntime_predicts_what_infer_predicted(trained):
    x = np.load(trained / "x.npy")
    ours = np.load(trained / "pred.npy")
    s = ort.InferenceSession(str(trained / "ck.onnx"), providers=["CPUExecutionProvider"])
    theirs = s.run(None, {"x": x})[0]
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-6)
    # The checkpoint's weights are the trained ones, not the initial model's.
    s0 = ort.InferenceSession(str(trained / "mlp.onnx"), providers=["CPUExecutionProvider"])
    assert not np.allclose(s0.run(None, {"x": x})[0], ours)


def combined_training_model(m):
    """The ONNX IR's training step: ModelProto.graph concatenated with training_info[0].algorithm."""
    ti = m.training_info[0]
    g = onnx.helper.make_graph(list(m.graph.node) + list(ti.algorithm.node), "step",
                               list(m.graph.input) + list(ti.algorithm.input), list(ti.algorithm.output),
                               list(m.graph.initializer) + list(ti.algorithm.initializer))
    g.value_info.extend(list(m.graph.value_info) + list(ti.algorithm.value_info))
    out = onnx.helper.make_model(g, opset_imports=list(m.opset_import), ir_version=m.ir_version)
    out.functions.extend(m.functions)
    return out


def test_onnxruntime_runs_the_stored_training_step(trained):
    """Another runtime executes the stored algorithm (fused ops through their function bodies); one step must
    match an independent numpy computation of the loss, the gradients and the optimizer update."""
    from mlp_reference import mlp_loss_and_grads

    m = onnx.load(trained / "ck.onnx")
    step_model = combined_training_model(m)
    onnx.checker.check_model(step_model, full_check=True)
    x, y = np.load(trained / "x.npy")[:32], np.load(trained / "y.npy")[:32]
    s = ort.InferenceSession(step_model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    got = dict(zip(names, s.run(None, {"x": x, "target": y})))
    new = {e.key: got[e.value] for e in m.training_info[0].update_binding}

    state = {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in m.training_info[0].algorithm.initializer}
    weights = {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in m.graph.initializer}
    meta = {p.key: p.value for p in m.metadata_props}
    loss, grads = mlp_loss_and_grads(m, x, y)
    np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
    step, lr = int(state["optim.step"]), float(state["optim.lr"])
    assert new["optim.step"] == step + 1
    for w, g in grads.items():
        if meta["onnxtrain.optimizer.kind"] == "adam":
            b1, b2, eps, t = 0.9, 0.999, 1e-8, step + 1
            m1 = b1 * state[w + ".exp_avg"] + (1 - b1) * g
            v = b2 * state[w + ".exp_avg_sq"] + (1 - b2) * g * g
            ref = weights[w] - lr * (m1 / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            np.testing.assert_allclose(new[w + ".exp_avg"], m1, rtol=1e-4, atol=1e-9)
            np.testing.assert_allclose(new[w + ".exp_avg_sq"], v, rtol=1e-4, atol=1e-12)
        else:
            buf = float(meta["onnxtrain.optimizer.momentum"]) * state[w + ".momentum_buffer"] + g
            ref = weights[w] - lr * buf
            np.testing.assert_allclose(new[w + ".momentum_buffer"], buf, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(new[w], ref, rtol=1e-5, atol=1e-7)
        assert not np.array_equal(new[w], weights[w].astype(np.float32)), w
