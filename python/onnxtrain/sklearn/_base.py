"""The training loop shared by every estimator: epochs of shuffled mini-batches fed to an onnxtrain
TrainingSession, with scikit-learn's MLP conventions for shuffling, early stopping, n_iter_no_change/tol,
loss_curve_, validation_scores_, verbose output and pickling. Subclasses say how to build the session, how to
encode targets and how to score."""
from __future__ import annotations

import os
import warnings

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state, gen_batches, shuffle as sk_shuffle

from .. import TrainingSession, _onnxtrain

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _validate_data(estimator, *args, **kwargs):
        return estimator._validate_data(*args, **kwargs)


def mpi_world_size() -> int:
    """Ranks of the MPI job this process belongs to (1 outside mpirun). Read from the launcher's environment where
    it says, so asking does not initialize MPI."""
    if not _onnxtrain.launched_by_mpi():
        return 1
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return _onnxtrain.communicator_from_environment().size


def new_session(estimator, *args, **kwargs) -> TrainingSession:
    """The estimator's TrainingSession. Estimators train in one process: under ``mpirun -np N`` (N > 1) every rank
    would fit its own model on all the data, so they refuse with a message saying what to do instead."""
    world = mpi_world_size()
    if world > 1:
        raise RuntimeError(
            f"{type(estimator).__name__}.fit runs in one process, but this is one of {world} MPI ranks (mpirun): every "
            "rank would fit its own model on all the data. Run it without mpirun, or train data-parallel with "
            "onnxtrain.TrainingSession(..., parallel=True) and onnxtrain.DistributedSampler (docs/distributed.md).")
    return TrainingSession(*args, **kwargs)


def validate_data(estimator, *args, **kwargs):
    return _validate_data(estimator, *args, **kwargs)


def store_params(estimator, params):
    """Sets every __init__ argument (``locals()`` of __init__) as an attribute of the same name, unchanged, as
    scikit-learn's estimator API requires."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


def dense(X):
    """A C-contiguous dense batch (sparse matrices are densified one batch at a time)."""
    if hasattr(X, "toarray"):
        X = X.toarray()
    return np.ascontiguousarray(X)


class SessionEstimator(BaseEstimator):
    """Base of the onnxtrain estimators. Subclasses implement:

    - ``_new_session(X, Y, rs)``: a TrainingSession (first pass: from the initial weights);
    - ``_score_raw(X, y_raw, sample_weight)``: the validation score (accuracy or R2) of the current weights;
    - ``_input_name``: the model input that X feeds;
    optionally ``_batch_penalty(n)``, ``_epoch_end()``, ``_trigger_stopping(msg)``, ``_sample_weight_scale``.
    """

    # How per-sample weights are fed so that the loss is the weighted mean sum(s * l) / sum(s), as scikit-learn's:
    # "mean" losses divide by the batch count themselves, "sum" losses do not.
    _loss_reduction = "mean"

    # Training ----------------------------------------------------------------------------------------------
    def _fit_loop(self, X, Y, y_raw, sample_weight, incremental, first_pass, rs):
        """Runs the epochs. X: features (model dtype), Y: encoded targets (fed as the loss target), y_raw: the
        targets in user space (validation scores), sample_weight: None or one weight per sample."""
        if first_pass:
            self.n_iter_ = 0
            self.t_ = 0
            self.n_skipped_steps_ = 0
            self.loss_curve_ = []
            self._no_improvement_count = 0
            if self.early_stopping:
                self.validation_scores_ = []
                self.best_validation_score_ = -np.inf
                self.best_loss_ = None
            else:
                self.best_loss_ = np.inf
                self.validation_scores_ = None
                self.best_validation_score_ = None
        if self.early_stopping and incremental:
            raise ValueError("partial_fit does not support early_stopping=True")

        n_all = X.shape[0]
        if self.early_stopping:
            stratify = self._stratify(y_raw)
            train_idx, val_idx = train_test_split(np.arange(n_all), random_state=rs,
                                                  test_size=self.validation_fraction, stratify=stratify)
            if len(val_idx) < 2:
                raise ValueError("The validation set is too small. Increase 'validation_fraction' or the size of "
                                 "your dataset.")
            X_val, y_val = X[val_idx], y_raw[val_idx]
            sw_val = None if sample_weight is None else sample_weight[val_idx]
            X_train, Y_train = X[train_idx], Y[train_idx]
            sw_train = None if sample_weight is None else sample_weight[train_idx]
            self._best_weights = self._session.weights()
        else:
            X_train, Y_train, sw_train = X, Y, sample_weight
            X_val = y_val = sw_val = None

        n = X_train.shape[0]
        batch_size = self._effective_batch_size(n)
        sample_idx = np.arange(n, dtype=int)
        s = self._session
        feed_target = s.target_name
        # The loss's per-sample weight input ("sample_weight" unless the model already uses that name).
        feed_sw = next((f for f in s.feed_names if f not in s.input_names and f != feed_target), None)
        # on_non_finite="skip": a skipped batch changed nothing, so the epoch's loss averages the others.
        skipped_at_start = skipped = s.skipped_steps
        native = not hasattr(X_train, "toarray")  # sparse X is densified batch by batch in Python
        if native:
            X_train = np.ascontiguousarray(X_train)
        try:
            for _ in range(self.max_iter):
                if self.shuffle:
                    sample_idx = sk_shuffle(sample_idx, random_state=rs)
                # Dense data: the whole epoch in one native call; sparse: the Python loop below, batch by batch.
                accumulated, applied = self._native_epoch(
                    X_train, Y_train, sw_train, sample_idx if self.shuffle else None, batch_size, feed_target,
                    feed_sw) if native else (0.0, 0)
                for batch in () if native else gen_batches(n, batch_size):
                    idx = sample_idx[batch] if self.shuffle else batch
                    m = batch.stop - batch.start
                    feeds = {self._input_name: dense(X_train[idx]), feed_target: Y_train[idx]}
                    sw = None if sw_train is None else sw_train[idx]
                    if feed_sw:
                        feeds[feed_sw] = self._scaled_sample_weight(sw, m)
                    penalty = self._batch_penalty(m if sw is None else float(np.sum(sw)))
                    loss = s.train_step(feeds)
                    if loss != loss and s.skipped_steps != skipped:
                        skipped = s.skipped_steps
                        continue
                    accumulated += (loss + penalty) * m
                    applied += m
                self.n_iter_ += 1
                self.loss_ = accumulated / applied if applied else float("nan")
                self.t_ += n
                self.loss_curve_.append(self.loss_)
                if self.verbose:
                    print("Iteration %d, loss = %.8f" % (self.n_iter_, self.loss_))
                self._update_no_improvement_count(X_val, y_val, sw_val)
                self._epoch_end()
                if self._no_improvement_count > self.n_iter_no_change:
                    what = "Validation score" if self.early_stopping else "Training loss"
                    msg = "%s did not improve more than tol=%f for %d consecutive epochs." % (
                        what, self.tol, self.n_iter_no_change)
                    if self._trigger_stopping(msg):
                        break
                    self._no_improvement_count = 0
                if s.stop_requested:  # a schedule of the session's own (adaptive) asked to stop
                    if self.verbose:
                        print("Learning rate too small. Stopping.")
                    break
                if incremental:
                    break
                if self.n_iter_ == self.max_iter:
                    warnings.warn("Stochastic Optimizer: Maximum iterations (%d) reached and the optimization hasn't "
                                  "converged yet." % self.max_iter, ConvergenceWarning)
        except KeyboardInterrupt:
            warnings.warn("Training interrupted by user.")
        finally:
            self.n_skipped_steps_ = getattr(self, "n_skipped_steps_", 0) + s.skipped_steps - skipped_at_start
        if self.early_stopping:
            s.set_weights(self._best_weights)
        self._fitted_from_session()

    def _native_epoch(self, X, Y, sw, order, batch_size, feed_target, feed_sw):
        """The epoch's batches run by TrainingSession.train_epoch (one call, no per-batch Python): the same rows,
        weights and steps as the Python loop; returns (sum over applied batches of (loss + penalty) * rows, rows
        of the applied batches)."""
        r = self._session.train_epoch({self._input_name: X, feed_target: Y}, batch_size, order=order,
                                      sample_weight=sw, sample_weight_feed=feed_sw,
                                      weights_sum_to_one=self._loss_reduction != "mean",
                                      squares_of=self._penalty_weights())
        squares = r["squares"].tolist() or None
        accumulated = 0.0
        applied = 0
        for i, (loss, m, weight_sum) in enumerate(zip(r["loss"].tolist(), r["rows"].tolist(),
                                                      r["weight_sum"].tolist())):
            if loss != loss:  # skipped under on_non_finite="skip" (raise would have raised): nothing applied
                continue
            penalty = self._batch_penalty(m if sw is None else weight_sum, None if squares is None else squares[i])
            accumulated += (loss + penalty) * m
            applied += m
        return accumulated, applied

    def _effective_batch_size(self, n):
        if self.batch_size == "auto" or self.batch_size is None:
            return min(200, n)
        if self.batch_size > n or self.batch_size < 1:
            warnings.warn("Got `batch_size` less than 1 or larger than sample size. It is going to be clipped")
        return int(np.clip(self.batch_size, 1, n))

    def _scaled_sample_weight(self, sw, m):
        dtype = self._sample_weight_dtype
        if sw is None:
            return np.full(m, 1.0 if self._loss_reduction == "mean" else 1.0 / m, dtype)
        total = float(np.sum(sw))
        scale = (m if self._loss_reduction == "mean" else 1.0) / total if total > 0 else 0.0
        return np.ascontiguousarray(sw * scale, dtype=dtype)

    def _update_no_improvement_count(self, X_val, y_val, sw_val):
        if self.early_stopping:
            score = self._score_raw(X_val, y_val, sw_val)
            self.validation_scores_.append(score)
            if self.verbose:
                print("Validation score: %f" % score)
            if score < self.best_validation_score_ + self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if score > self.best_validation_score_:
                self.best_validation_score_ = score
                self._best_weights = self._session.weights()
        else:
            # Written so that an epoch whose every batch was skipped (loss NaN) counts as no improvement.
            if not self.loss_curve_[-1] <= self.best_loss_ - self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if self.loss_curve_[-1] < self.best_loss_:
                self.best_loss_ = self.loss_curve_[-1]

    # Hooks with defaults.
    def _batch_penalty(self, n, squares=None):
        """The penalty added to a batch's reported loss; squares: the sum of squares of _penalty_weights() before
        the batch's step (None: read them now)."""
        return 0.0

    def _penalty_weights(self):
        return []

    def _epoch_end(self):
        self._session.end_epoch(self.loss_)

    def _trigger_stopping(self, msg):
        if self.verbose:
            print(msg + " Stopping.")
        return True

    def _stratify(self, y_raw):
        return None

    def _fitted_from_session(self):
        pass

    # Persistence --------------------------------------------------------------------------------------------
    def save_checkpoint(self, path):
        """Saves the fitted session as a trainable ONNX checkpoint (docs/checkpoint.md); atomic."""
        self._check_session()
        self._session.save_checkpoint(path)

    def _check_session(self):
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self)
        if getattr(self, "_session", None) is None:
            raise ValueError(f"{type(self).__name__}: no training session")

    def __getstate__(self):
        state = dict(super().__getstate__())
        session = state.pop("_session", None)
        if session is not None:
            # The native session is not picklable; its checkpoint rebuilds it exactly (weights, optimizer state).
            state["_session_checkpoint"] = session._s.checkpoint()
        return state

    def __setstate__(self, state):
        checkpoint = state.pop("_session_checkpoint", None)
        super().__setstate__(state)
        if checkpoint is not None:
            self._session = TrainingSession.from_checkpoint(checkpoint)
