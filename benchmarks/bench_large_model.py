"""A model over 2 GB, end to end (issue 29, point 2): build, train, checkpoint, resume, export, run in onnxruntime.

    .venv/bin/python benchmarks/bench_large_model.py [--width 8192] [--layers 9] [--batch 8] [--steps 3]
        [--resume-steps 2] [--dir build/bench/large] [--keep]

The model is a wide MLP: `layers` blocks of MatMul [width, width] + Add bias (+ Relu between blocks), float32,
He-initialised from a fixed seed; 8192 x 9 is 2.42 GB of weights (2.25 GiB, over protobuf's 2 GiB limit). It is
written with ONNX external data by this script (one layer at a time, so the writer never holds the model).
Then, each phase in a process of its own so that each peak RSS (getrusage ru_maxrss) is that phase's alone:

  train   load the model, Adam (lr 1e-4) with MSE against a fixed target: `steps` steps, save_checkpoint,
          `resume-steps` more steps; records every loss
  resume  from_checkpoint, the same `resume-steps` steps: the losses must equal the train phase's to the bit;
          export_inference (external data) and infer on the batch
  ort     onnxruntime loads the exported model (external data) and must give the session's outputs (1e-5)

Prints one line per phase with its peak RSS, and the ratio to the weight bytes. Not a CI test: about two and a half
minutes and 17 GB of memory at the default size (7.1x the weights; benchmarks/README.md, "Large models").
Needs the build's Python package (ONNXTRAIN_BUILD_DIR, default build/release).
"""
import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release"))


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def batch(args):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.batch, args.width), dtype=np.float32)
    y = rng.standard_normal((args.batch, args.width), dtype=np.float32)
    return x, y


def build(args, d):
    """Writes model.onnx + model.onnx.data one layer at a time."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    data_name = "model.onnx.data"
    offset = 0
    with open(d / data_name, "wb") as f:
        def external(name, arr):
            nonlocal offset
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape))
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(arr.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            f.write(arr.tobytes())
            offset += arr.nbytes
            return t

        h = "x"
        for i in range(args.layers):
            w = (rng.standard_normal((args.width, args.width), dtype=np.float32) * np.float32(np.sqrt(2.0 / args.width)))
            inits.append(external(f"fc{i}.weight", w))
            del w
            inits.append(external(f"fc{i}.bias", np.zeros(args.width, np.float32)))
            nodes.append(helper.make_node("MatMul", [h, f"fc{i}.weight"], [f"mm{i}"], name=f"fc{i}/MatMul"))
            out = "y" if i == args.layers - 1 else f"add{i}"
            nodes.append(helper.make_node("Add", [f"mm{i}", f"fc{i}.bias"], [out], name=f"fc{i}/Add"))
            if i < args.layers - 1:
                nodes.append(helper.make_node("Relu", [out], [f"h{i}"], name=f"relu{i}"))
                h = f"h{i}"
    graph = helper.make_graph(nodes, "wide_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", args.width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", args.width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(d / "model.onnx"))
    return {"weight_bytes": offset}


def train(args, d):
    import onnxtrain as ot

    x, y = batch(args)
    t0 = time.perf_counter()
    s = ot.TrainingSession(str(d / "model.onnx"), loss="mse", optimizer="adam", learning_rate=1e-4)
    load_s = time.perf_counter() - t0
    feeds = {"x": x, s.target_name: y}
    losses, step_s = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        losses.append(s.train_step(feeds))
        step_s.append(time.perf_counter() - t)
    t = time.perf_counter()
    s.save_checkpoint(str(d / "ck.onnx"))
    save_s = time.perf_counter() - t
    for _ in range(args.resume_steps):
        losses.append(s.train_step(feeds))
    return {"losses": losses, "load_s": load_s, "step_s": step_s, "save_s": save_s}


def resume(args, d):
    import onnxtrain as ot

    x, y = batch(args)
    t = time.perf_counter()
    s = ot.TrainingSession.from_checkpoint(str(d / "ck.onnx"))
    resume_s = time.perf_counter() - t
    feeds = {"x": x, s.target_name: y}
    losses = [s.train_step(feeds) for _ in range(args.resume_steps)]
    t = time.perf_counter()
    s.export_inference(str(d / "exported.onnx"))
    export_s = time.perf_counter() - t
    (pred,) = s.infer({"x": x})
    np.save(d / "pred.npy", pred)
    return {"losses": losses, "resume_s": resume_s, "export_s": export_s}


def ort(args, d):
    import onnxruntime

    x, _ = batch(args)
    sess = onnxruntime.InferenceSession(str(d / "exported.onnx"), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {"x": x})
    pred = np.load(d / "pred.npy")
    return {"max_abs_diff": float(np.max(np.abs(out - pred))), "max_abs": float(np.max(np.abs(pred)))}


PHASES = {"build": build, "train": train, "resume": resume, "ort": ort}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--resume-steps", type=int, default=2)
    p.add_argument("--dir", default=str(ROOT / "build" / "bench" / "large"))
    p.add_argument("--keep", action="store_true", help="keep the model and checkpoint files")
    p.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    args = p.parse_args()
    d = pathlib.Path(args.dir)
    if args.phase:  # a child: one phase, its result and peak RSS as JSON on the last line
        sys.path.insert(0, str(BUILD / "python"))
        r = PHASES[args.phase](args, d)
        r["peak_rss"] = peak_rss_bytes()
        print(json.dumps(r))
        return

    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    print(f"loadavg {open('/proc/loadavg').read().strip()}; width {args.width}, layers {args.layers}, batch {args.batch}")
    results = {}
    for phase in ("build", "train", "resume", "ort"):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--phase", phase] + sys.argv[1:], check=True,
                             capture_output=True, text=True).stdout
        results[phase] = json.loads(out.strip().splitlines()[-1])
        results[phase]["wall_s"] = time.perf_counter() - t
    wb = results["build"]["weight_bytes"]
    print(f"weights: {wb / 1e9:.3f} GB ({wb / 2**30:.3f} GiB; protobuf's limit is 2 GiB); Adam state: 2x that")
    files = sorted((f.name, f.stat().st_size) for f in d.iterdir())
    print("files: " + ", ".join(f"{n} {sz / 1e9:.2f} GB" for n, sz in files if sz > 1e6))
    for phase in ("build", "train", "resume", "ort"):
        r = results[phase]
        print(f"{phase:7s} peak RSS {r['peak_rss'] / 1e9:6.2f} GB = {r['peak_rss'] / wb:5.2f}x the weights, "
              f"{r['wall_s']:6.1f} s")
    tr, rs = results["train"], results["resume"]
    print(f"train: load {tr['load_s']:.1f} s, steps {', '.join(f'{x:.1f}' for x in tr['step_s'])} s, "
          f"save_checkpoint {tr['save_s']:.1f} s; resume: from_checkpoint {rs['resume_s']:.1f} s, "
          f"export_inference {rs['export_s']:.1f} s")
    print("losses: " + " ".join(repr(x) for x in tr["losses"]))
    cont = tr["losses"][args.steps:]
    same = cont == rs["losses"]
    print(f"resumed losses {rs['losses']} {'==' if same else '!='} uninterrupted {cont}")
    diff = results["ort"]["max_abs_diff"]
    print(f"onnxruntime on the exported model: max |diff| {diff:.3g} (outputs up to {results['ort']['max_abs']:.3g})")
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
    if not same or not diff <= 1e-5 * max(1.0, results["ort"]["max_abs"]):
        sys.exit("FAILED: resume or export does not match")


if __name__ == "__main__":
    main()
