"""OnnxRegressor and OnnxClassifier: fine-tune a given ONNX model (for instance one converted from scikit-learn
with skl2onnx) with onnxtrain, as scikit-learn estimators. Training starts from the model's own weights."""
from __future__ import annotations

import os
import re

import numpy as np
import onnx
from onnx import numpy_helper
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import _check_partial_fit_first_call
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, column_or_1d

from .. import LossSpec, ScheduleSpec, make_adapter, make_loss, make_optimizer, make_penalty, make_schedule, merge_lora
from ._base import SessionEstimator, new_session, store_params, validate_data

_NP_OF_ONNX = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64}


def load_proto(model) -> onnx.ModelProto:
    """A ModelProto from a path, bytes or a ModelProto (a copy, never the caller's object)."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise TypeError(f"model: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def prune(model: onnx.ModelProto, outputs) -> onnx.ModelProto:
    """The model restricted to the nodes and initializers that compute `outputs` (so that post-processing such as
    label extraction, which may use ops onnxtrain does not run, stays out of the training session)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    needed = set(outputs)
    keep = []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for attr in node.attribute:  # values captured by subgraphs
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    needed.update(i for n in sub.node for i in n.input)
    del g.node[:]
    g.node.extend(reversed(keep))
    kept_inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    kept_outputs = [o for name in outputs for o in model.graph.output if o.name == name]
    del g.output[:]
    g.output.extend(kept_outputs)
    return m


def with_weights(model: onnx.ModelProto, weights) -> onnx.ModelProto:
    """A copy of the model with these initializers replaced (same names)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(np.asarray(weights[init.name]), init.name))
    return m


class _OnnxEstimator(SessionEstimator):
    _default_loss = "square"

    def __init__(self, model, *, loss=None, optimizer="sgd", learning_rate=0.001, momentum=None, penalty=None,
                 max_iter=100, batch_size="auto", shuffle=True, random_state=None, warm_start=False,
                 early_stopping=False, validation_fraction=0.1, n_iter_no_change=10, tol=1e-4, trainable=None,
                 prediction=None, device=None, verbose=False, on_non_finite="raise", adapter=None,
                 memory=None):
        store_params(self, locals())


    # The model -------------------------------------------------------------------------------------------------
    def _inspect(self):
        """Parses the model once per fit: input, prediction output, trainable weights, pruned training model."""
        full = load_proto(self.model)
        g = full.graph
        inits = {i.name: i for i in g.initializer}
        inputs = [i for i in g.input if i.name not in inits]
        if len(inputs) != 1:
            raise ValueError(f"model: expected exactly one input (fed with X), got {[i.name for i in inputs]}")
        float_outputs = [o.name for o in g.output if o.type.tensor_type.elem_type in _NP_OF_ONNX]
        prediction = self.prediction or self._default_prediction(g, float_outputs)
        if prediction not in [o.name for o in g.output]:
            raise ValueError(f"prediction: '{prediction}' is not an output of the model; outputs: "
                             f"{[o.name for o in g.output]}")
        pruned = prune(full, [prediction])
        float_inits = [i.name for i in pruned.graph.initializer if i.data_type in _NP_OF_ONNX]
        if self.trainable is None:
            # With adapters only they train, unless trainable adds weights (a fresh head).
            trainable = [] if self._adapter_on() else float_inits
        elif isinstance(self.trainable, str):
            rx = re.compile(self.trainable)
            trainable = [n for n in float_inits if rx.search(n)]
            if not trainable:
                raise ValueError(f"trainable: the pattern {self.trainable!r} matches no floating-point initializer; "
                                 f"they are: {float_inits}")
        else:
            trainable = list(self.trainable)
        in_type = inputs[0].type.tensor_type.elem_type
        if in_type not in _NP_OF_ONNX:
            raise ValueError(f"model: input '{inputs[0].name}' must be float or double, got "
                             f"{onnx.TensorProto.DataType.Name(in_type)}")
        out = next(o for o in g.output if o.name == prediction)
        dims = out.type.tensor_type.shape.dim
        self._full_model = full
        self._input_name = inputs[0].name
        self._input_dtype = _NP_OF_ONNX[in_type]
        self._prediction = prediction
        self._prediction_dtype = _NP_OF_ONNX.get(out.type.tensor_type.elem_type, np.float32)
        self._prediction_width = dims[1].dim_value if len(dims) == 2 and dims[1].HasField("dim_value") else None
        self._trainable_names = trainable
        return pruned

    def _adapter_on(self):
        return make_adapter(self.adapter).kind != "none"

    def _default_prediction(self, g, float_outputs):
        if not float_outputs:
            raise ValueError("model: has no floating-point output to train")
        return float_outputs[0]

    def _loss_spec(self):
        spec = make_loss(self._default_loss if self.loss is None else self.loss)
        spec.sample_weight = True
        return spec

    def _new_session(self, pruned, weights=None):
        opt = make_optimizer(self.optimizer, momentum=self.momentum)
        schedule = None
        if self.learning_rate == "adaptive":  # scikit-learn's rule, with this estimator's tol and patience
            patience = int(min(self.n_iter_no_change, 2**62))
            schedule = make_schedule("adaptive", tol=float(self.tol), n_iter_no_change=patience)
        elif isinstance(self.learning_rate, (ScheduleSpec, str, dict)):
            schedule = make_schedule(self.learning_rate)
        elif self.learning_rate is not None:
            opt.learning_rate = float(self.learning_rate)
        self._adaptive = schedule is not None and schedule.kind == "adaptive"
        self._session = new_session(self, pruned, trainable=self._trainable_names, loss=self._loss_spec(), optimizer=opt,
                                        schedule=schedule, penalty=make_penalty(self.penalty),
                                        prediction=self._prediction, device=self.device,
                                        on_non_finite=self.on_non_finite, adapter=self.adapter, memory=self.memory)
        if weights is not None:
            self._session.set_weights(weights)
        self._sample_weight_dtype = self._prediction_dtype

    # Fitting ---------------------------------------------------------------------------------------------------
    def fit(self, X, y, sample_weight=None):
        """Fine-tunes the model on (X, y). Without warm_start, every fit starts again from the given model's
        weights; with it, from the last fit's."""
        return self._fit(X, y, sample_weight, incremental=False)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over (X, y), continuing the current weights and optimizer state."""
        return self._fit(X, y, sample_weight, incremental=True)

    def _fit(self, X, y, sample_weight, incremental, classes=None):
        first_pass = not hasattr(self, "_session") or (not self.warm_start and not incremental)
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], multi_output=True,
                             dtype=(np.float64, np.float32), reset=first_pass)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X)
        rs = self._random_state = check_random_state(self.random_state)
        if first_pass:
            pruned = self._inspect()
            self._pruned = pruned
            self._encode_setup(y, classes)
            self._new_session(pruned)
        elif not incremental:  # warm_start: the trained weights, a fresh optimizer (as scikit-learn's MLPs)
            self._new_session(self._pruned, self._session.weights())
        X = X.astype(self._input_dtype, copy=False)
        Y = self._encode(y)
        self._fit_loop(X, Y, y, sample_weight, incremental, first_pass, rs)
        return self

    def _trigger_stopping(self, msg):
        # With the adaptive schedule the session divides the rate and asks to stop (stop_requested) itself.
        return False if self._adaptive else super()._trigger_stopping(msg)

    def _fitted_from_session(self):
        weights = self._session.weights()
        if self._adapter_on():  # model_ is the base architecture: adapters folded into their weights
            adapted = {w[:-len(".lora_A")] for w in weights if w.endswith(".lora_A")}
            merged = merge_lora(self._session.export_inference_bytes())
            weights = {k: v for k, v in weights.items() if not k.endswith((".lora_A", ".lora_B"))}
            weights.update({t.name: numpy_helper.to_array(t) for t in merged.graph.initializer if t.name in adapted})
        self.model_ = with_weights(self._full_model, weights)

    def _infer(self, X):
        X = X.toarray() if hasattr(X, "toarray") else X
        return self._session.infer({self._input_name: np.ascontiguousarray(X, dtype=self._input_dtype)})[0]

    def _checked(self, X):
        check_is_fitted(self)
        return validate_data(self, X, accept_sparse=["csr", "csc"], reset=False, dtype=(np.float64, np.float32))


class OnnxRegressor(RegressorMixin, _OnnxEstimator):
    """Fine-tunes an ONNX regression model with onnxtrain.

    Parameters:
        model: path, bytes or onnx.ModelProto with one input (fed with X).
        loss: a loss name ('square' by default, 'absolute', 'huber', 'elastic', ...) or a LossSpec.
        optimizer: 'sgd', 'nesterov' (momentum 0.9), 'momentum', 'adam', 'adamw', or an OptimizerSpec.
        learning_rate: a float, or a schedule (ScheduleSpec, name or dict; the base rate is then the optimizer's).
        momentum: overrides the optimizer's momentum (sgd).
        penalty: None or Elastic(l1, l2) on the trainable weights (added to the loss).
        max_iter (epochs), batch_size ('auto' = min(200, n)), shuffle, random_state, warm_start, early_stopping,
        validation_fraction, n_iter_no_change, tol: as scikit-learn's MLP.
        trainable: None (every float initializer), a list of names, or a regular expression.
        prediction: the output the loss reads (default: the first float output).
        device: 'cpu', 'cuda' or 'cuda:N' (None: $ONNXTRAIN_DEVICE, else 'cpu').
        verbose: print the loss after each epoch.
        on_non_finite: 'raise' (default: a NaN/Inf loss or gradient raises OnnxtrainError naming the step and the
        tensor) or 'skip' (that batch's update is not applied, a NonFiniteStepWarning names it, n_skipped_steps_
        counts it, and loss_ averages the other batches).
        adapter: None, 'lora', a dict or an AdapterSpec: train LoRA adapters beside the targeted weights, which
        stay frozen (docs/lora.md); ``trainable`` then adds weights trained in full. model_ has the adapters merged.
        memory: None, 'auto' or a list of forward node globs: recompute activations in the backward pass instead of
        keeping them (docs/memory.md); the same fit, to the bit, in less memory.

    Fitted: model_ (the trained ModelProto), loss_curve_, validation_scores_, n_iter_, n_features_in_,
    n_skipped_steps_.
    """

    def _encode_setup(self, y, classes):
        self._y_ndim = y.ndim

    def _encode(self, y):
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        return np.ascontiguousarray(Y, dtype=self._prediction_dtype)

    def _score_raw(self, X, y, sample_weight):
        return r2_score(y, self._predict_raw(X), sample_weight=sample_weight)

    def _predict_raw(self, X):
        p = self._infer(X)
        return p.ravel() if self._y_ndim == 1 and p.ndim == 2 and p.shape[1] == 1 else p

    def predict(self, X):
        """The fine-tuned model's prediction output (1-D when fitted on a 1-D y)."""
        return self._predict_raw(self._checked(X))


class OnnxClassifier(ClassifierMixin, _OnnxEstimator):
    """Fine-tunes an ONNX classifier with onnxtrain. Parameters as OnnxRegressor, and:

        loss: 'neg_log' by default (on the probabilities output, one-hot targets); 'cross_entropy' (the
        prediction is logits) or 'nll' (log-probabilities) take class indices; 'bce_with_logits' one-hot targets.
        prediction: default: the first float output (skl2onnx: 'probabilities'; convert with
        options={'zipmap': False}).

    Fitted: model_, classes_ (sorted, as scikit-learn; column i of the prediction is classes_[i]), loss_curve_,
    validation_scores_, n_iter_, n_features_in_, n_skipped_steps_.
    """

    _default_loss = "neg_log"

    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """One epoch over (X, y); classes (every class of the problem) may be given on the first call."""
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    def _encode_setup(self, y, classes):
        y = column_or_1d(y, warn=True)
        self.classes_ = np.unique(y) if classes is None else np.unique(np.asarray(classes))
        width = self._prediction_width
        if width is not None and width != len(self.classes_) and not (width == 1 and len(self.classes_) == 2):
            raise ValueError(f"prediction '{self._prediction}' has {width} columns but y has {len(self.classes_)} "
                             f"classes {self.classes_.tolist()}; pass every class with partial_fit(classes=...)")
        spec = self._loss_spec()
        self._target_kind = "indices" if spec.kind in ("cross_entropy", "nll") else "onehot"
        self._output_kind = {"cross_entropy": "logits", "nll": "log_probabilities", "bce_with_logits": "logits"}.get(
            spec.kind, "logits" if spec.input == "logits" else "probabilities")

    def _encode(self, y):
        y = column_or_1d(y, warn=True)
        idx = np.searchsorted(self.classes_, y)
        if np.any(idx >= len(self.classes_)) or np.any(self.classes_[np.minimum(idx, len(self.classes_) - 1)] != y):
            raise ValueError(f"y has classes not in classes_ {self.classes_.tolist()}")
        if self._target_kind == "indices":
            return np.ascontiguousarray(idx.astype(np.int64))
        if self._prediction_width == 1:
            return np.ascontiguousarray(idx.reshape(-1, 1), dtype=self._prediction_dtype)
        onehot = np.zeros((len(y), len(self.classes_)), dtype=self._prediction_dtype)
        onehot[np.arange(len(y)), idx] = 1
        return onehot

    def _stratify(self, y_raw):
        return y_raw

    def _proba(self, X):
        p = self._infer(X).astype(np.float64)
        if self._output_kind == "log_probabilities":
            p = np.exp(p)
        elif self._output_kind == "logits":
            if p.shape[1] == 1:
                p = 1 / (1 + np.exp(-p))
            else:
                p = np.exp(p - p.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
        if p.shape[1] == 1:
            p = np.hstack([1 - p, p])
        return p

    def _score_raw(self, X, y, sample_weight):
        return accuracy_score(y, self.classes_[np.argmax(self._proba(X), axis=1)], sample_weight=sample_weight)

    def predict_proba(self, X):
        """Class probabilities in the order of classes_."""
        return self._proba(self._checked(X))

    def predict(self, X):
        """The most probable class."""
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
