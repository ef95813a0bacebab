"""Models over 2 GB at a small scale (docs/checkpoint.md, "Large models"): ONNXTRAIN_EXTERNAL_DATA_BYTES lowers the
2 GB switch, so a small MLP takes the large-model path from Python: load -> train -> checkpoint (external data,
streamed from the session) -> resume bit for bit -> export with external data, and onnx and onnxruntime read both
files. benchmarks/bench_large_model.py runs a real 2 GiB model."""
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest

from conftest import ROOT

import onnxtrain as ot


def data_files(d, name):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(name + ".") and p.name.endswith(".data"))


def batches(n):
    rng = np.random.default_rng(3)
    out = []
    for _ in range(n):
        x = rng.standard_normal((16, 8), dtype=np.float32)
        out.append((x, np.tanh(x[:, :1] - 0.5 * x[:, 1:2]).astype(np.float32)))
    return out


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXTRAIN_EXTERNAL_DATA_BYTES", "4096")  # the model's ~19 KB of tensors count as large
    path = tmp_path / "mlp.onnx"
    subprocess.run([sys.executable, ROOT / "examples" / "make_mlp.py", path, "--sizes", "8", "64", "64", "1"],
                   check=True, capture_output=True)
    return path


def train(s, bs):
    return [s.train_step({"x": x, s.target_name: y}) for x, y in bs]


def test_checkpoint_resume_and_export_with_external_data(model, tmp_path):
    bs = batches(5)
    straight = ot.TrainingSession(str(model), loss="mse", optimizer="adam", learning_rate=1e-2)
    straight_losses = train(straight, bs)

    s = ot.TrainingSession(str(model), loss="mse", optimizer="adam", learning_rate=1e-2)
    first = train(s, bs[:3])
    ck = tmp_path / "ck.onnx"
    s.save_checkpoint(ck)
    assert len(data_files(tmp_path, "ck.onnx")) == 1
    # Standard ONNX with external data: onnx loads it (data included) and its full checker accepts it.
    onnx.checker.check_model(onnx.load(str(ck)), full_check=True)
    m = onnx.load(str(ck), load_external_data=False)
    external = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert "fc2.weight" in external
    alg_external = [t.name for t in m.training_info[0].algorithm.initializer
                    if t.data_location == onnx.TensorProto.EXTERNAL]
    assert "fc2.weight.exp_avg" in alg_external and "fc2.weight.exp_avg_sq" in alg_external

    r = ot.TrainingSession.from_checkpoint(ck)
    assert first + train(r, bs[3:]) == straight_losses  # the same floats: bit for bit
    for name, w in straight.weights().items():
        np.testing.assert_array_equal(r.weights()[name], w)
    for name in straight.state_names:
        np.testing.assert_array_equal(r.state(name), straight.state(name))

    exported = tmp_path / "exported.onnx"
    r.export_inference(exported)
    assert len(data_files(tmp_path, "exported.onnx")) == 1
    x = bs[0][0]
    (ours,) = r.infer({"x": x})
    (theirs,) = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(theirs, ours, rtol=1e-6, atol=1e-6)
    # onnxruntime runs the checkpoint too (it ignores training_info): the same predictions.
    (ck_pred,) = onnxruntime.InferenceSession(str(ck), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (s_pred,) = s.infer({"x": x})
    np.testing.assert_allclose(ck_pred, s_pred, rtol=1e-6, atol=1e-6)


def test_a_flipped_byte_in_the_data_file_is_named(model, tmp_path):
    s = ot.TrainingSession(str(model), loss="mse", optimizer="adam", learning_rate=1e-2)
    train(s, batches(2))
    ck = tmp_path / "ck.onnx"
    s.save_checkpoint(ck)
    (data,) = data_files(tmp_path, "ck.onnx")
    raw = bytearray((tmp_path / data).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    (tmp_path / data).write_bytes(bytes(raw))
    with pytest.raises(Exception, match="does not match its checksum"):
        ot.TrainingSession.from_checkpoint(ck)


def test_cli_run_resume_and_export_with_external_data(tmp_path, build_dir, monkeypatch):
    """The command line's checkpoints (the Trainer's streamed save), resume and export on the large-model path:
    digits fine-tunes its head with the body frozen, so frozen weights travel through the store too."""
    monkeypatch.setenv("ONNXTRAIN_EXTERNAL_DATA_BYTES", "1")
    subprocess.run([sys.executable, ROOT / "examples" / "digits" / "make_digits.py", tmp_path / "data"],
                   check=True, capture_output=True)
    cfg = tmp_path / "config.yaml"
    cfg.write_text((ROOT / "examples" / "digits" / "config.yaml").read_text())
    cli = str(build_dir / "cli" / "onnxtrain")

    def run(*args):
        r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    # As tests/cli's resume test: a step schedule (cosine over "the whole run" would end at max_steps in the part)
    common = ["--set", "early_stopping.patience=0", "--set", "log.progress=none", "--set", "checkpoint.every=10",
              "--set", "train.epochs=2", "--set", "schedule.kind=step", "--set", "schedule.step_size=20",
              "--set", "schedule.gamma=0.5"]
    run("train", cfg, *common, "--set", "output=full")
    run("train", cfg, *common, "--set", "train.max_steps=23", "--set", "output=part")
    ck = tmp_path / "part" / "checkpoints" / "step-23.onnx"
    assert len(data_files(ck.parent, "step-23.onnx")) == 1
    run("resume", ck, "--set", "train.max_steps=0")
    for d in ("full", "part"):
        assert len(data_files(tmp_path / d, "model.onnx")) == 1
    full, part = (onnx.load(str(tmp_path / d / "model.onnx")) for d in ("full", "part"))
    assert {t.name: t.raw_data for t in full.graph.initializer} == {t.name: t.raw_data for t in part.graph.initializer}

    ck = max((tmp_path / "part" / "checkpoints").glob("step-*.onnx"), key=lambda p: int(p.stem[5:]))  # the newest
    assert len(data_files(ck.parent, ck.name)) == 1  # keep_last removed the older ones with their data files
    assert len(list(ck.parent.glob("*.data"))) == len(list(ck.parent.glob("*.onnx")))
    run("export", ck, "-o", tmp_path / "exported.onnx")
    assert len(data_files(tmp_path, "exported.onnx")) == 1
    x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    name = onnx.load(str(tmp_path / "exported.onnx"), load_external_data=False).graph.input[0].name
    ours = onnxruntime.InferenceSession(str(tmp_path / "exported.onnx"), providers=["CPUExecutionProvider"])
    ref = ot.TrainingSession.from_checkpoint(ck)
    np.testing.assert_allclose(ours.run(None, {name: x})[0], ref.infer({name: x})[0], rtol=1e-6, atol=1e-6)
