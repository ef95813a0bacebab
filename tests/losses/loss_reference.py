"""Independent reference for the loss subgraphs (losses/loss.cpp, losses/penalty.cpp), in float64.

As a script it checks the loss test of the C++ suite (tests/losses/test_losses.cpp, next to this file):
    /usr/bin/python3 loss_reference.py DIR
Every sub-folder of DIR is one case: spec.json, pred.npy, target.npy, optional sample_weight.npy, and the
values onnxtrain computed: loss.npy and grad.npy (d loss / d pred). The reference is torch.nn.functional
(value, and the gradient by autograd), or a numpy formula where torch has no such loss (elastic, penalty).
spec.json's "expect" is "match", or "loss_mismatch"/"grad_mismatch" for deliberately corrupted copies, which
prove that each comparison can fail. Exits non-zero when any case is not as expected.
Needs torch (Debian's python3-torch) and numpy, not onnx.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

RTOL = 1e-10


def bcast(w, rank):
    """Per-sample weights [N] shaped to broadcast over a per-element loss of the given rank."""
    return w.reshape([-1] + [1] * (rank - 1))


def reduce(s, per_element, sw):
    """onnxtrain's convention: weights scale each element, mean divides by the element count."""
    if sw is not None:
        per_element = per_element * bcast(sw, per_element.dim())
    return per_element.mean() if s["reduction"] == "mean" else per_element.sum()


def torch_loss(s, p, t, sw):
    kind = "square" if s["kind"] == "mse" else s["kind"]
    red = s["reduction"]
    if kind == "square":
        if sw is None and not s["half"]:
            return F.mse_loss(p, t, reduction=red)
        return reduce(s, F.mse_loss(p, t, reduction="none") * (0.5 if s["half"] else 1.0), sw)
    if kind == "absolute":
        return F.l1_loss(p, t, reduction=red) if sw is None else reduce(s, F.l1_loss(p, t, reduction="none"), sw)
    if kind == "huber":
        if sw is None:
            return F.huber_loss(p, t, reduction=red, delta=s["delta"])
        return reduce(s, F.huber_loss(p, t, reduction="none", delta=s["delta"]), sw)
    w = None if sw is None else bcast(sw, p.dim())  # torch's BCE `weight` has exactly our convention
    if kind == "neg_log":
        inp = s["input"] or "probability"
        eps = s["eps"]
        if inp == "probability":
            eps = np.finfo(np.float64).eps if eps is None else eps
            q = torch.clamp(p, eps, 1 - eps) if eps > 0 else p
            return F.binary_cross_entropy(q, t, weight=w, reduction=red)
        z = p
        if eps is not None and eps > 0:
            bound = float(np.log((1 - eps) / eps))
            z = torch.clamp(p, -bound, bound)
        return F.binary_cross_entropy_with_logits(z, t, weight=w, reduction=red)
    if kind == "bce_with_logits":
        pw = torch.tensor(s["pos_weight"], dtype=torch.float64) if s["pos_weight"] else None
        return F.binary_cross_entropy_with_logits(p, t, weight=w, pos_weight=pw, reduction=red)
    if kind in ("cross_entropy", "nll"):
        cw = torch.tensor(s["class_weights"], dtype=torch.float64) if s["class_weights"] else None
        ii = -100 if s["ignore_index"] is None else s["ignore_index"]
        indices = s["target_format"] == "indices"
        if kind == "cross_entropy":
            f = lambda r: F.cross_entropy(p, t, weight=cw, ignore_index=ii, reduction=r,
                                          label_smoothing=s["label_smoothing"])
        else:
            f = lambda r: F.nll_loss(p, t, weight=cw, ignore_index=ii, reduction=r)
        if sw is None:
            return f(red)
        # torch has no per-sample weights here: weight torch's unreduced loss, and divide a mean by torch's own
        # denominator (sum of the class weights of non-ignored targets; the sample count for probabilities).
        none = f("none")
        total = (none * bcast(sw, none.dim())).sum()
        if red == "sum":
            return total
        if indices:
            valid = t != ii
            denom = cw[t[valid]].sum() if cw is not None else valid.sum().to(torch.float64)
        else:
            denom = torch.tensor(float(p.numel() // p.shape[1]), dtype=torch.float64)
        # The denominator formula must agree with torch's own mean (checked with the weights left out).
        own = f("mean").detach()
        mine = (none.sum() / denom).detach()
        if abs(float(own - mine)) > 1e-12 * max(1.0, abs(float(own))):
            raise RuntimeError(f"reference denominator disagrees with torch's mean: {float(mine)} vs {float(own)}")
        return total / denom
    raise ValueError(f"no torch reference for kind {kind}")


def numpy_elastic(s, p, t, sw):
    """Value and gradient by hand: l1 |d| + l2 d^2."""
    d = p - t
    l = s["l1"] * np.abs(d) + s["l2"] * d * d
    g = s["l1"] * np.sign(d) + 2 * s["l2"] * d
    if sw is not None:
        wb = sw.reshape([-1] + [1] * (p.ndim - 1))
        l, g = l * wb, g * np.broadcast_to(wb, g.shape)
    if s["reduction"] == "mean":
        return l.mean(), g / p.size
    return l.sum(), g


def numpy_penalty(s, d):
    """loss + l1 sum|w| + l2 sum w^2: value and gradients w.r.t. loss and each weight."""
    ws = [np.load(os.path.join(d, f"w{i}.npy")) for i in range(s["n_weights"])]
    base = float(np.load(os.path.join(d, "base.npy")))
    value = base + s["l1"] * sum(np.abs(w).sum() for w in ws) + s["l2"] * sum((w * w).sum() for w in ws)
    grads = [np.array(1.0)] + [s["l1"] * np.sign(w) + 2 * s["l2"] * w for w in ws]
    ours = [np.load(os.path.join(d, "grad_base.npy"))] + [np.load(os.path.join(d, f"grad_w{i}.npy"))
                                                          for i in range(len(ws))]
    return value, grads, ours


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    return float(np.max(np.abs(ours - ref)) / max(scale, 1e-300)) if ref.size else 0.0


def check_case(d):
    with open(os.path.join(d, "spec.json")) as f:
        s = json.load(f)
    loss = float(np.load(os.path.join(d, "loss.npy")))
    if s["kind"] == "penalty":
        ref_loss, ref_grads, our_grads = numpy_penalty(s, d)
        grad_err = max(rel_err(o, r) for o, r in zip(our_grads, ref_grads))
        degenerate = False
    else:
        p_np = np.load(os.path.join(d, "pred.npy"))
        t_np = np.load(os.path.join(d, "target.npy"))
        sw_path = os.path.join(d, "sample_weight.npy")
        sw_np = np.load(sw_path) if os.path.exists(sw_path) else None
        grad = np.load(os.path.join(d, "grad.npy"))
        if s["kind"] == "elastic":
            ref_loss, ref_grad = numpy_elastic(s, p_np, t_np, sw_np)
        else:
            p = torch.tensor(p_np, dtype=torch.float64, requires_grad=True)
            t = torch.tensor(t_np)
            sw = None if sw_np is None else torch.tensor(sw_np, dtype=torch.float64)
            l = torch_loss(s, p, t, sw)
            l.backward()
            ref_loss, ref_grad = float(l.detach()), p.grad.numpy()
        grad_err = rel_err(grad, ref_grad)
        degenerate = not np.any(ref_grad)  # a zero gradient would make the gradient check vacuous
    loss_err = rel_err(loss, ref_loss)
    loss_ok, grad_ok = loss_err <= RTOL, grad_err <= RTOL
    expect = s.get("expect", "match")
    want = {"match": (True, True), "loss_mismatch": (False, True), "grad_mismatch": (True, False)}[expect]
    ok = (loss_ok, grad_ok) == want and not degenerate
    print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(d)}: loss {loss:.17g} vs {ref_loss:.17g} "
          f"(rel {loss_err:.1e}), grad rel {grad_err:.1e}, expected {expect}"
          f"{', reference gradient is all zeros' if degenerate else ''}")
    return ok


def main(root):
    cases = sorted(os.path.join(root, c) for c in os.listdir(root) if os.path.isdir(os.path.join(root, c)))
    if not cases:
        print(f"no cases in {root}")
        return 1
    bad = [c for c in cases if not check_case(c)]
    print(f"{len(cases) - len(bad)}/{len(cases)} cases as expected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
