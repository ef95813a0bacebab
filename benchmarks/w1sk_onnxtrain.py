#!/usr/bin/env python3
"""W1-sk for onnxtrain: onnxtrain.sklearn.MLPRegressor with exactly the hyper-parameters of the shared
w1_mlp_sklearn.py (SPEC["w1sk"]["params"]), timed and reported the same way: one untimed warm-up fit with
max_iter=1, then the timed fit; samples/s = epochs * 65536 / fit time; final train MSE over all rows.

Our estimator draws its Glorot initialisation and per-epoch shuffles from the same RandomState as
scikit-learn's (random_state=0), so both train the same network on the same batches and their per-epoch
loss_curve_ (recorded as loss_curve_half_mse, like the sklearn peer) can be compared epoch by epoch.

Run through torch_peer.py (which puts the shared peers folder on sys.path and records peak RSS), with the
onnxtrain Python package importable (run.sh sets PYTHONPATH to the build's python folder).
"""
import time
import warnings

from common import Recorder, base_args, probe, set_threads

ap = base_args(__doc__)
ap.add_argument("--replicas", type=int, default=1,
                help="one-thread replicas splitting each batch (docs/replicas.md); 1 = one session on OpenMP's threads")
args = ap.parse_args()
set_threads(args.threads)

import numpy as np  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import onnxtrain  # noqa: E402
from onnxtrain.sklearn import MLPRegressor  # noqa: E402

from bench_data import SPEC, load  # noqa: E402

warnings.filterwarnings("ignore", category=ConvergenceWarning)
P = dict(SPEC["w1sk"]["params"])
d = load("w1")
X, y = d["w1_X"], d["w1_y"].ravel()
n = X.shape[0]

probe_start = probe()
MLPRegressor(**{**P, "max_iter": 1}, replicas=args.replicas).fit(X, y)  # warm-up
m = MLPRegressor(**P, replicas=args.replicas)
t0, c0 = time.perf_counter(), time.process_time()
m.fit(X, y)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
mse = float(np.mean((m.predict(X).astype(np.float64) - y) ** 2))
probe_end = probe()
epochs = m.n_iter_
rec = Recorder(args, "onnxtrain-MLPRegressor")
# fit_cpu_s: the process's CPU time during the fit; on a loaded machine it moves less than the wall time.
extra = dict(fit_s=dt, fit_cpu_s=cpu, epochs=epochs, replicas=args.replicas, coef_dtype=str(m.coefs_[0].dtype),
             loss_curve_half_mse=[float(v) for v in m.loss_curve_],
             versions={"onnxtrain": getattr(onnxtrain, "__version__", "?"), "numpy": np.__version__},
             probe_start=probe_start, probe_end=probe_end)
rec.add("w1sk", "fit_s_per_epoch", dt / epochs, "s/epoch",
        f"{epochs} epochs in {dt:.3g} s; weights {m.coefs_[0].dtype}", **extra)
rec.add("w1sk", "train_samples_per_s", epochs * n / dt, "samples/s", "", **extra)
rec.add("w1sk", "final_train_loss", mse, "MSE",
        f"after {epochs} epochs; per-epoch loss_curve_ (=MSE/2) " + " ".join(f"{v:.4g}" for v in m.loss_curve_),
        **extra)
