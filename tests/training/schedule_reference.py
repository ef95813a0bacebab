"""Checks the learning rates written by tests/training/test_schedules.cpp against the references.

    python schedule_reference.py torch DIR    # needs torch: torch.optim.lr_scheduler, step by step
    python schedule_reference.py sklearn DIR  # needs scikit-learn: its own MLP/SGDOptimizer code

DIR holds cases.txt (one case a line: name kind base_lr step_size gamma total_steps warmup_steps min_lr
power_t tol n_iter_no_change steps) and NAME.npy with our rate for steps 0..steps-1 (for adaptive: the rate
used in each epoch, losses in NAME_loss.npy and the epoch at which we request a stop, or -1, in
NAME_stop.npy). Exits 0 when everything matches to 1e-12 relative, 1 otherwise (each mismatch printed).
"""
import math
import sys
from pathlib import Path

import numpy as np

RTOL = 1e-12


def read_cases(d):
    cases = []
    for line in (d / "cases.txt").read_text().splitlines():
        f = line.split()
        if not f:
            continue
        cases.append(dict(name=f[0], kind=f[1], base=float(f[2]), step_size=int(f[3]), gamma=float(f[4]),
                          total=int(f[5]), warmup=int(f[6]), min_lr=float(f[7]), power_t=float(f[8]),
                          tol=float(f[9]), patience=int(f[10]), steps=int(f[11])))
    return cases


def compare(name, ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        print(f"{name}: {ours.shape[0]} values, reference has {ref.shape[0]}")
        return False
    bad = np.abs(ours - ref) > RTOL * np.abs(ref) + 1e-300
    if bad.any():
        k = int(np.argmax(bad))
        print(f"{name}: step {k}: ours {ours[k]!r}, reference {ref[k]!r} ({int(bad.sum())} steps differ)")
        return False
    return True


# ---- torch ----

def torch_rates(make_sched, base, steps):
    """The lr the optimizer uses for each of `steps` updates, scheduler stepped after each optimizer step."""
    import torch

    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base)
    sched = make_sched(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return rates


def warmup_cosine_lambda(c):
    # transformers' get_cosine_schedule_with_warmup (num_cycles=0.5) with a floor, held after total_steps.
    w, t, floor = c["warmup"], c["total"], c["min_lr"] / c["base"]

    def f(k):
        if k < w:
            return k / max(1, w)
        if k >= t:
            return floor
        progress = (k - w) / max(1, t - w)
        return floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def linear_lambda(c):
    # transformers' get_linear_schedule_with_warmup, verbatim.
    w, t = c["warmup"], c["total"]

    def f(k):
        if k < w:
            return float(k) / float(max(1, w))
        return max(0.0, float(t - k) / float(max(1, t - w)))

    return f


def check_torch(d):
    from torch.optim import lr_scheduler as S

    ok, n = True, 0
    for c in read_cases(d):
        ours = np.load(d / f"{c['name']}.npy")
        base, steps, kind = c["base"], c["steps"], c["kind"]
        refs = []
        if kind == "constant":
            refs.append(("LambdaLR(1)", torch_rates(lambda o: S.LambdaLR(o, lambda k: 1.0), base, steps)))
        elif kind == "step":
            refs.append(("StepLR", torch_rates(lambda o: S.StepLR(o, c["step_size"], c["gamma"]), base, steps)))
        elif kind == "exponential":
            refs.append(("ExponentialLR", torch_rates(lambda o: S.ExponentialLR(o, c["gamma"]), base, steps)))
        elif kind == "cosine":
            if c["warmup"] == 0:
                # CosineAnnealingLR is periodic past T_max (it climbs back up); ours holds the floor, so the
                # two are compared up to and including T_max only.
                upto = min(steps, c["total"] + 1)
                r = torch_rates(lambda o: S.CosineAnnealingLR(o, T_max=c["total"], eta_min=c["min_lr"]), base, upto)
                refs.append(("CosineAnnealingLR", (r, upto)))
            refs.append(("LambdaLR(warm-up+cosine)",
                         torch_rates(lambda o: S.LambdaLR(o, warmup_cosine_lambda(c)), base, steps)))
        elif kind == "linear":
            refs.append(("LambdaLR(linear warm-up+decay)",
                         torch_rates(lambda o: S.LambdaLR(o, linear_lambda(c)), base, steps)))
        else:
            continue
        for label, r in refs:
            if isinstance(r, tuple):
                r, upto = r
                good = compare(f"{c['name']} vs {label}", ours[:upto], r)
            else:
                good = compare(f"{c['name']} vs {label}", ours, r)
            ok = ok and good
            n += 1
    print(f"torch: {n} comparisons, {'all match' if ok else 'MISMATCH'}")
    return ok and n > 0


# ---- scikit-learn ----

def check_sklearn(d):
    from sklearn.neural_network import MLPClassifier
    from sklearn.neural_network._stochastic_optimizers import SGDOptimizer

    ok, n = True, 0
    for c in read_cases(d):
        name, base = c["name"], c["base"]
        if c["kind"] == "invscaling":
            # MLP's SGD optimizer, with time_step = number of updates so far: lr0 / (k + 1)^power_t, which is
            # also SGDClassifier's eta0 / pow(t, power_t) for t = k + 1 (its t starts at 1, one per sample).
            opt = SGDOptimizer([np.zeros(1)], learning_rate_init=base, lr_schedule="invscaling",
                               power_t=c["power_t"])
            ref = [opt.learning_rate]
            for k in range(1, c["steps"]):
                opt.iteration_ends(k)
                ref.append(opt.learning_rate)
            ok = compare(f"{name} vs SGDOptimizer(invscaling)", np.load(d / f"{name}.npy"), ref) and ok
            ref_sgd = [base / math.pow(k + 1, c["power_t"]) for k in range(c["steps"])]
            ok = compare(f"{name} vs SGDClassifier's eta0/pow(t, power_t)", np.load(d / f"{name}.npy"), ref_sgd) and ok
            n += 2
        elif c["kind"] == "adaptive":
            losses = np.load(d / f"{name}_loss.npy")
            ours = np.load(d / f"{name}.npy")
            our_stop = int(np.load(d / f"{name}_stop.npy")[0])
            # Drive sklearn's own epoch-end code: MLPClassifier._update_no_improvement_count and
            # SGDOptimizer.trigger_stopping, in the order _fit_stochastic calls them.
            est = MLPClassifier(solver="sgd", learning_rate="adaptive", learning_rate_init=base, tol=c["tol"],
                                n_iter_no_change=c["patience"])
            est.loss_curve_ = []
            est.best_loss_ = np.inf
            est._no_improvement_count = 0
            est._optimizer = SGDOptimizer([np.zeros(1)], learning_rate_init=base, lr_schedule="adaptive")
            ref, stop = [], -1
            for e, loss in enumerate(losses):
                ref.append(est._optimizer.learning_rate)  # the rate used during epoch e
                est.loss_curve_.append(float(loss))
                est._update_no_improvement_count(False, None, None, None)
                est._optimizer.iteration_ends(e)
                if est._no_improvement_count > est.n_iter_no_change:
                    if est._optimizer.trigger_stopping("", False):
                        stop = e
                        break
                    est._no_improvement_count = 0
            upto = len(ref)
            ok = compare(f"{name} vs MLPClassifier(adaptive)", ours[:upto], ref) and ok
            if stop != our_stop:
                print(f"{name}: we request a stop after epoch {our_stop}, sklearn stops after epoch {stop}")
                ok = False
            n += 1
    print(f"sklearn: {n} comparisons, {'all match' if ok else 'MISMATCH'}")
    return ok and n > 0


if __name__ == "__main__":
    mode, d = sys.argv[1], Path(sys.argv[2])
    good = check_torch(d) if mode == "torch" else check_sklearn(d)
    sys.exit(0 if good else 1)
