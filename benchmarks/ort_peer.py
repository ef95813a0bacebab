#!/usr/bin/env python3
"""onnxruntime-training peer: trains a shared workload (../shared/bench/models/wN.onnx) through ORT's on-device
training API (artifacts.generate_artifacts + api.Module/Optimizer), following the timing protocol of the shared
torch_harness.py, and writes result records in the same JSONL format as the PyTorch peers.

  ort_peer.py --workload w1|w2|w3|w4 --threads N --out RAW.jsonl [--losses LOSSES.npy] [--repeats 3]
              [--artifacts DIR]

Runs in its own venv (benchmarks/compare.sh makes build/bench/venv-ort): onnxruntime-training-cpu conflicts
with the onnxruntime of the project venv, and its Python package imports torch, which the venv takes from
Debian's python3-torch (--system-site-packages).

Same model, weights, data, batch order, loss and optimizer as every other system:
- W1: MSE (mean), Adam lr 1e-3 = ORT's AdamWOptimizer with weight_decay 0 and adam_mode 0 (torch's
  semantics: eps added to sqrt(v)/sqrt(1-b2^t), decay before the update). The generate_artifacts default,
  OptimType.AdamW, uses adam_mode 1 (Hugging Face's: eps added to sqrt(v), decay after the update) and
  eps 1e-6, so the optimizer block is built here instead.
- W3: token cross-entropy over [batch, 64, 1000] logits: a Transpose to [batch, 1000, 64] in front of ORT's
  SoftmaxCrossEntropyLoss (classes on axis 1, mean over all batch*64 tokens = torch's
  cross_entropy(logits.reshape(-1, 1000), targets.reshape(-1))). AdamW lr 1e-3 wd 0.01, adam_mode 0.
  torch's export leaves LayerNormalization's optional Mean/InvStdDev outputs out; ORT's gradient of that op
  needs them, so they are named (the forward computation is unchanged).
- W4: MSE, plain SGD lr 0.01 (ORT's SGDOptimizerV2).
- W2: softmax cross-entropy; SGD with nesterov momentum 0.9. ORT's training API has no momentum SGD (its
  Optimizer accepts only AdamWOptimizer and SGDOptimizerV2 graphs), so ORT runs forward+backward
  (Module.train_step) and the nesterov update runs in numpy on the parameters it exposes
  (CheckpointState.parameters[...].grad/.data). Recorded with optimizer="numpy nesterov" so the table can
  say that this column is not ORT alone.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench", "peers"))
sys.path.insert(0, PEERS)
import bench_data  # noqa: E402  (the shared SPEC and data loader)

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--workload", required=True, choices=["w1", "w2", "w3", "w4"])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--out", required=True)
ap.add_argument("--losses", default=None)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--artifacts", default=None, help="where to write the training artifacts (default: a temp dir)")
args = ap.parse_args()
for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(v, str(args.threads))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnxruntime.training import artifacts, onnxblock  # noqa: E402
from onnxruntime.training.api import CheckpointState, Module, Optimizer  # noqa: E402
from onnxruntime.training.onnxblock import _graph_utils  # noqa: E402
from onnxruntime.training.onnxblock.optim.optim import AdamW, AdamWOptimizer  # noqa: E402

ort.set_default_logger_severity(3)  # artifact generation logs every graph transformer at info level
W = args.workload
S = bench_data.SPEC[W]
MODEL = os.path.join(bench_data.MODELS_DIR, f"{W}.onnx")
WARMUP = {"w1": S["steps"], "w2": 20, "w3": 10, "w4": 500}[W]  # as the shared torch peers
B, STEPS = S["batch"], S["steps"]
OPT = S["optimizer"]


class TorchAdamWOptimizer(AdamWOptimizer):
    """ORT's AdamWOptimizer node with adam_mode 0 (PyTorch's AdamW) instead of the block's fixed 1."""

    def build(self, *names):
        return self._build_optimizer_node(
            list(names), _graph_utils.generate_graph_name("adamw.updated_flag"), "AdamWOptimizer",
            {"alpha": self._betas[0], "beta": self._betas[1], "epsilon": self._eps,
             "weight_decay": self._weight_decay, "correct_bias": 1, "adam_mode": 0})


def torch_adamw(lr_unused, betas, eps, weight_decay):
    block = AdamW(betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    block._adamw = TorchAdamWOptimizer(betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    return block


class TokenCrossEntropy(onnxblock.Block):
    """Mean cross-entropy over every token of [batch, seq, classes] logits: SoftmaxCrossEntropyLoss wants the
    classes on axis 1, so the logits are transposed to [batch, classes, seq]; labels are [batch, seq]."""

    def __init__(self, seq):
        super().__init__()
        self._seq = seq

    def build(self, logits):
        g = self.base.graph
        moved = _graph_utils.generate_graph_name("logits_classes_axis1")
        loss = _graph_utils.generate_graph_name("loss")
        log_prob = _graph_utils.generate_graph_name("log_prob")  # ORT's gradient of this op needs it
        g.input.append(onnx.helper.make_tensor_value_info("labels", onnx.TensorProto.INT64, ["batch", self._seq]))
        g.node.append(onnx.helper.make_node("Transpose", [logits], [moved], perm=[0, 2, 1],
                                            name=_graph_utils.generate_graph_name("Transpose")))
        g.node.append(onnx.helper.make_node("SoftmaxCrossEntropyLoss", [moved, "labels"], [loss, log_prob], reduction="mean",
                                            name=_graph_utils.generate_graph_name("SoftmaxCrossEntropyLoss")))
        return loss


def make_artifacts(out_dir):
    model = onnx.load(MODEL)
    # ORT's LayerNormalization gradient reads the optional Mean and InvStdDev outputs, which torch's export
    # leaves out; naming them changes nothing in the forward computation.
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_inv_std"])
    trainable = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    frozen = [i.name for i in model.graph.initializer if i.name not in trainable]
    if W in ("w1", "w4"):
        loss = artifacts.LossType.MSELoss
    elif W == "w2":
        loss = artifacts.LossType.CrossEntropyLoss
    else:
        loss = TokenCrossEntropy(S["seq"])
    if W == "w1":
        optimizer = torch_adamw(OPT["lr"], OPT["betas"], OPT["eps"], 0.0)
    elif W == "w3":
        optimizer = torch_adamw(OPT["lr"], OPT["betas"], OPT["eps"], OPT["weight_decay"])
    else:
        optimizer = artifacts.OptimType.SGD  # W2 applies its nesterov update in numpy (see the docstring)
    artifacts.generate_artifacts(model, requires_grad=trainable, frozen_params=frozen, loss=loss,
                                 optimizer=optimizer, artifact_directory=out_dir)
    return trainable


d = bench_data.load(W)
xname, yname = S["data"]["x"], S["data"]["target"]
X, Y = np.ascontiguousarray(d[xname]), np.ascontiguousarray(d[yname])
art = args.artifacts or tempfile.mkdtemp(prefix=f"ort_{W}_")
os.makedirs(art, exist_ok=True)
trainable = make_artifacts(art)
opts = ort.SessionOptions()
opts.intra_op_num_threads = args.threads
opts.inter_op_num_threads = 1
nesterov = W == "w2"
mu = OPT.get("momentum", 0.0)


def build():
    state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
    module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"),
                    session_options=opts)
    opt = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    opt.set_learning_rate(OPT["lr"])
    return state, module, opt


def one_run(n_steps, record=False):
    state, module, opt = build()
    module.train()
    batches = [(X[i * B:(i + 1) * B], Y[i * B:(i + 1) * B]) for i in range(n_steps)]
    losses = []
    bufs = {}
    t0 = time.perf_counter()
    for x, y in batches:
        loss = module(x, y)
        if nesterov:
            # torch.optim.SGD(momentum=mu, nesterov=True, dampening=0): buf = g at step 1, then mu*buf + g;
            # p -= lr * (g + mu*buf)
            for name in trainable:
                p = state.parameters[name]
                g = p.grad
                b = bufs.get(name)
                b = g.copy() if b is None else mu * b + g
                bufs[name] = b
                p.data = p.data - OPT["lr"] * (g + mu * b)
        else:
            opt.step()
        module.lazy_reset_grad()
        if record:
            losses.append(float(loss))
    dt = time.perf_counter() - t0
    return state, dt, losses


def final_loss(state):
    """Loss over the whole data set with the trained weights, in float64, from an inference session on the
    forward model (chunks as the torch peers: W2 all at once in 1600s, W3 200 sequences)."""
    model = onnx.load(MODEL)
    for init in model.graph.initializer:
        if init.name in trainable:
            init.CopyFrom(onnx.numpy_helper.from_array(state.parameters[init.name].data, init.name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    chunk = {"w1": len(X), "w2": 1600, "w3": 200, "w4": len(X)}[W]
    total, count = 0.0, 0
    for r in range(0, len(X), chunk):
        out = sess.run(None, {iname: X[r:r + chunk]})[0].astype(np.float64)
        y = Y[r:r + chunk]
        if W in ("w1", "w4"):
            total += float(np.sum((out - y.astype(np.float64)) ** 2))
            count += out.size
        else:
            logits = out.reshape(-1, out.shape[-1])
            labels = y.reshape(-1)
            m = logits.max(axis=1, keepdims=True)
            lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
            total += float(np.sum(lse - logits[np.arange(len(labels)), labels]))
            count += len(labels)
    return total / count


one_run(WARMUP)
state, ref_s, losses = one_run(STEPS, record=True)
ref_final = final_loss(state)
if args.losses:
    np.save(args.losses, np.asarray(losses, np.float32))
times = []
for _ in range(args.repeats):
    state, dt, _ = one_run(STEPS)
    times.append(dt)
final = final_loss(state)

units = B * (S["seq"] if W == "w3" else 1)
if W == "w4":
    metric, unit, vals = "us_per_step", "us/step", [t / STEPS * 1e6 for t in times]
else:
    metric = "train_tokens_per_s" if W == "w3" else "train_samples_per_s"
    unit = "tokens/s" if W == "w3" else "samples/s"
    vals = [STEPS * units / t for t in times]
common = {"workload": W, "peer": "onnxruntime-training", "threads": args.threads,
          "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": platform.python_version(),
          "versions": {"onnxruntime-training": ort.__version__, "onnx": onnx.__version__, "numpy": np.__version__},
          "optimizer": "numpy nesterov (ORT has no momentum SGD)" if nesterov else "ORT",
          "times_s": times, "steps": STEPS, "first_step_loss": losses[0], "last_step_loss": losses[-1],
          "ref_run_s": ref_s}
recs = [
    {**common, "metric": metric, "value": statistics.median(vals), "unit": unit, "runs": vals,
     "notes": f"runs {min(vals):.4g}-{max(vals):.4g}"},
    {**common, "metric": "final_train_loss", "value": final, "unit": "loss", "reference_run_final": ref_final},
    {**common, "metric": "peak_rss_mb", "value": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
     "unit": "MiB"},
]
with open(args.out, "a") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
        print(f"  {W:<4} onnxruntime-training t={args.threads} {r['metric']:<22} {r['value']:.6g} {r['unit']}")
