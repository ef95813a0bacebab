"""Independent reference for tests/training/test_optimizers.cpp: replays the C++ training run with torch.optim.

    /usr/bin/python3 optim_reference.py DIR

DIR holds spec.json (the optimizer options, defaults resolved), init_<weight>.npy, x.npy [B, n, 4],
t.npy [B, n, 1], and what onnxtrain produced after every step: w_<weight>.npy [steps, ...] and
s_<state>.npy [steps, ...] (state named "<weight>.<torch state key>" and "optim.step").
The model is fc1 -> ReLU -> fc2 (nn.Linear layout) with a mean squared error, in float64; step k trains on
batch k % B. Every weight and state must match to 1e-10 relative (max-abs error over max-abs value) at every
step; exits 1 otherwise. Convention "onnx" is checked against the ai.onnx.preview.training Momentum formula,
written out below in numpy, with torch only computing the gradients.
"""
import fnmatch
import json
import os
import sys

import numpy as np
import torch

RTOL = 1e-10
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def forward(p, x):
    h = torch.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
    return h @ p["fc2.weight"].T + p["fc2.bias"]


def make_optimizer(spec, params):
    # Parameter groups: the first group whose patterns match a weight takes it; the rest use the defaults.
    groups, rest = [[] for _ in spec["groups"]], []
    for n in NAMES:
        for k, g in enumerate(spec["groups"]):
            if any(fnmatch.fnmatchcase(n, pat) for pat in g["match"]):
                groups[k].append(params[n])
                break
        else:
            rest.append(params[n])
    param_groups = [{"params": rest}] if rest else []
    for k, g in enumerate(spec["groups"]):
        pg = {"params": groups[k]}
        if "lr" in g:
            pg["lr"] = g["lr"]
        if "weight_decay" in g:
            pg["weight_decay"] = g["weight_decay"]
        param_groups.append(pg)
    kind, lr, wd = spec["kind"], spec["lr"], spec["weight_decay"]
    if kind == "sgd":
        return torch.optim.SGD(param_groups, lr=lr, momentum=spec["momentum"], dampening=spec["dampening"],
                               nesterov=spec["nesterov"], weight_decay=wd)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(param_groups, lr=lr, betas=(spec["beta1"], spec["beta2"]), eps=spec["eps"], weight_decay=wd,
                   amsgrad=spec["amsgrad"])
    if kind == "adagrad":
        return torch.optim.Adagrad(param_groups, lr=lr, lr_decay=spec["lr_decay"], weight_decay=wd,
                                   initial_accumulator_value=spec["initial_accumulator_value"], eps=spec["eps"])
    raise SystemExit(f"unknown kind {kind}")


class OnnxMomentum:
    """ai.onnx.preview.training Momentum, per its spec (onnx/defs/training/defs.cc):
    G_reg = norm_coefficient*X + G; beta_adj = T > 0 ? beta : 1; V_new = alpha*V + beta_adj*G_reg;
    X_new = X - R*V_new (standard) or X - R*(G_reg + alpha*V_new) (nesterov). T counts earlier updates."""

    def __init__(self, spec, params):
        self.spec, self.params, self.t = spec, params, 0
        self.v = {n: np.zeros(p.shape) for n, p in params.items()}
        self.lr = {}
        self.wd = {}
        for n in NAMES:
            lr, wd = spec["lr"], spec["weight_decay"]
            for g in spec["groups"]:
                if any(fnmatch.fnmatchcase(n, pat) for pat in g["match"]):
                    lr, wd = g.get("lr", lr), g.get("weight_decay", wd)
                    break
            self.lr[n], self.wd[n] = lr, wd

    def step(self):
        s = self.spec
        alpha, beta = s["momentum"], s["beta"]
        for n, p in self.params.items():
            x, g = p.detach().numpy().copy(), p.grad.numpy()
            g_reg = self.wd[n] * x + g
            beta_adj = beta if self.t > 0 else 1.0
            v_new = alpha * self.v[n] + beta_adj * g_reg
            x_new = x - self.lr[n] * (g_reg + alpha * v_new) if s["nesterov"] else x - self.lr[n] * v_new
            self.v[n] = v_new
            with torch.no_grad():
                p.copy_(torch.from_numpy(x_new))
        self.t += 1

    def states(self):
        return {f"{n}.momentum_buffer": v for n, v in self.v.items()} | {"optim.step": np.array(self.t)}


def torch_states(opt, params):
    out = {}
    by_id = {id(p): n for n, p in params.items()}
    for p, st in opt.state.items():
        n = by_id[id(p)]
        for key, v in st.items():
            if key == "step":
                out["optim.step"] = np.array(float(v))
            elif v is not None:
                out[f"{n}.{key}"] = v.detach().numpy().copy()
    return out


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-300)) if ref.size else 0.0


def main(d):
    spec = json.load(open(os.path.join(d, "spec.json")))
    x_all, t_all = np.load(os.path.join(d, "x.npy")), np.load(os.path.join(d, "t.npy"))
    params = {n: torch.tensor(np.load(os.path.join(d, f"init_{n}.npy")), dtype=torch.float64, requires_grad=True)
              for n in NAMES}
    onnx_convention = spec["kind"] == "sgd" and spec["convention"] == "onnx"
    opt = OnnxMomentum(spec, params) if onnx_convention else make_optimizer(spec, params)
    sched = None
    if spec["schedule"] == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=spec["step_size"], gamma=spec["gamma"])
    elif spec["schedule"] == "exponential":
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=spec["gamma"])
    elif spec["schedule"] != "constant":
        raise SystemExit(f"no reference for schedule {spec['schedule']}")
    ours_w = {n: np.load(os.path.join(d, f"w_{n}.npy")) for n in NAMES}
    ours_s = {f[2:-4]: np.load(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("s_")}
    bad, worst, clipped = [], 0.0, 0
    for k in range(spec["steps"]):
        for p in params.values():
            p.grad = None
        x = torch.from_numpy(x_all[k % len(x_all)])
        t = torch.from_numpy(t_all[k % len(t_all)])
        loss = torch.mean((forward(params, x) - t) ** 2)
        if spec["penalty_l1"] or spec["penalty_l2"]:  # the elastic penalty is part of the loss
            loss = loss + sum(spec["penalty_l1"] * p.abs().sum() + spec["penalty_l2"] * (p * p).sum()
                              for p in params.values())
        loss.backward()
        if spec["max_grad_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), spec["max_grad_norm"])
            clipped += int(norm > spec["max_grad_norm"])
            print(f"  step {k + 1}: gradient norm {float(norm):.4f}", file=sys.stderr) if os.environ.get("OPTIM_VERBOSE") else None
        opt.step()
        if sched is not None:
            sched.step()
        ref_s = opt.states() if onnx_convention else torch_states(opt, params)
        # torch.optim.SGD keeps no step count; onnxtrain counts updates for every optimizer.
        ref_s.setdefault("optim.step", np.array(k + 1))
        if spec["gradient_accumulation"] > 1:  # buffers are zeroed by the update that consumes them
            ref_s.update({f"{n}.grad_accum": np.zeros(p.shape) for n, p in params.items()})
        if set(ref_s) != set(ours_s):
            bad.append(f"state names differ: torch {sorted(ref_s)}, onnxtrain {sorted(ours_s)}")
            break
        for n, p in params.items():
            e = rel_err(ours_w[n][k], p.detach().numpy())
            worst = max(worst, e)
            if e > RTOL:
                bad.append(f"step {k + 1}: weight {n} relative error {e:.3e}")
        for n, v in ref_s.items():
            e = rel_err(ours_s[n][k], v)
            worst = max(worst, e)
            if e > RTOL:
                bad.append(f"step {k + 1}: state {n} relative error {e:.3e}")
    if spec["max_grad_norm"] > 0 and not 0 < clipped < spec["steps"]:
        bad.append(f"clipping engaged on {clipped} of {spec['steps']} steps: the case must exercise both branches")
    print(f"{os.path.basename(d)}: worst relative error over {spec['steps']} steps {worst:.2e}"
          + (f", clipped on {clipped} steps" if spec["max_grad_norm"] > 0 else ""))
    for b in bad[:20]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
