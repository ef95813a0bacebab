"""LoRA step time against full fine-tuning (issue 26, point 5), in one run on the same model and batch.

    .venv/bin/python benchmarks/bench_lora.py [--layers 6] [--batch 8] [--seq 128] [--steps 5] [--threads 2]

The model is a BERT encoder of all-MiniLM-L6-v2's shape (hidden 384, 12 heads, FF 1536 GELU, vocab 30522, post-LN,
HF BERT's parameter names), written in torch here with random weights (the time of a step does not depend on the
values) and exported with torch.onnx.export, plus a 2-class head on the first token. Both runs use AdamW and
cross-entropy; "full" trains every float weight, "lora" trains rank-8 adapters on the attention query and value
projections and the head. Steps the two sessions in turn and prints the median step time of each (after warm-up steps) and their ratio.
Needs the build's Python package (ONNXTRAIN_BUILD_DIR, default build/release).
"""
import argparse
import io
import math
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release")) / "python"))
import onnxtrain as ot  # noqa: E402


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, d)


class Layer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(d, heads)
        self.attention.output = nn.Module()
        self.attention.output.dense, self.attention.output.LayerNorm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, ff)
        self.output = nn.Module()
        self.output.dense, self.output.LayerNorm = nn.Linear(ff, d), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x):
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(self.attention.self(x)))
        h = nn.functional.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(h))


class Bert(nn.Module):
    def __init__(self, layers, d=384, heads=12, ff=1536, vocab=30522, seq=512, classes=2):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(vocab, d)
        self.embeddings.position_embeddings = nn.Embedding(seq, d)
        self.embeddings.LayerNorm = nn.LayerNorm(d, eps=1e-12)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer(d, heads, ff) for _ in range(layers))
        self.classifier = nn.Linear(d, classes)

    def forward(self, input_ids):
        pos = self.embeddings.position_embeddings.weight[: input_ids.shape[1]]
        x = self.embeddings.LayerNorm(self.embeddings.word_embeddings(input_ids) + pos)
        for layer in self.encoder.layer:
            x = layer(x)
        return self.classifier(x[:, 0])


def session(model_bytes, **options):
    return ot.TrainingSession(model_bytes, loss="cross_entropy", optimizer="adamw", learning_rate=1e-4, **options)


def trainable_numbers(s):
    return sum(int(np.prod(s.get_weight(w).shape)) for w in s.trainable)


def alternating_medians(sessions, feeds, steps, warmup):
    """Steps the sessions in turn, so a change of machine load (other processes) hits both alike."""
    times = [[] for _ in sessions]
    for i in range(warmup + steps):
        for s, t in zip(sessions, times):
            t0 = time.perf_counter()
            s.train_step({"input_ids": feeds["input_ids"], s.target_name: feeds["labels"]})
            if i >= warmup:
                t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.manual_seed(0)
    model = Bert(args.layers).eval()
    ids = torch.randint(0, 30522, (args.batch, args.seq))
    f = io.BytesIO()
    torch.onnx.export(model, (ids,), f, input_names=["input_ids"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, dynamo=False)
    labels = np.arange(args.batch, dtype=np.int64) % 2
    full_s = session(f.getvalue())
    lora_s = session(f.getvalue(), trainable=["classifier.weight", "classifier.bias"],
                     adapter={"kind": "lora", "rank": 8, "alpha": 16,
                              "target": ["*attention.self.query.weight", "*attention.self.value.weight"]})
    feeds = {"input_ids": ids.numpy(), "labels": labels}
    full, lora = alternating_medians([full_s, lora_s], feeds, args.steps, args.warmup)
    n_full, n_lora = trainable_numbers(full_s), trainable_numbers(lora_s)
    print(f"BERT {args.layers} layers, batch {args.batch} x {args.seq} tokens, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"full fine-tuning: {full * 1e3:9.1f} ms/step  ({n_full:,} trainable numbers)")
    print(f"LoRA r=8 q,v:     {lora * 1e3:9.1f} ms/step  ({n_lora:,} trainable numbers)")
    print(f"ratio LoRA/full:  {lora / full:.3f}")


if __name__ == "__main__":
    main()
