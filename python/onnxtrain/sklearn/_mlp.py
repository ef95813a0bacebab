"""MLPRegressor and MLPClassifier: scikit-learn's multi-layer perceptrons, built as ONNX and trained by onnxtrain.

What is scikit-learn's and copied as is: the parameters, Glorot-uniform initialisation drawn from the same
RandomState in the same order (so `random_state` gives the same initial weights), the train/validation split
and the per-epoch shuffles (same draws), batch sizes ("auto" = min(200, n)), the half squared error / log-loss,
the L2 term alpha/2 * sum ||W||^2 / batch size on the weights but not the intercepts, invscaling and adaptive
learning rates, early stopping on the validation score, n_iter_no_change/tol, loss_curve_, coefs_/intercepts_.

Where the maths differ slightly (docs/python.md, "Semantics"):
- the L2 term is applied as coupled weight decay alpha/B with B the effective batch size (times the mean sample
  weight), so the last, smaller batch of an epoch gets alpha/B instead of alpha/len(batch) (the reported loss
  uses len(batch), as scikit-learn);
- momentum follows torch's convention (p -= lr * buf) rather than scikit-learn's velocity (v = mu v - lr g),
  which only differs after the learning rate changes (invscaling, adaptive);
- Adam's epsilon is added to sqrt(v)/sqrt(1 - beta2^t) (torch) instead of sqrt(v) (scikit-learn).
"""
from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.metrics import accuracy_score, r2_score
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, Options, StrOptions
from sklearn.utils.multiclass import _check_partial_fit_first_call, type_of_target, unique_labels
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, column_or_1d

from .. import LossSpec, OptimizerSpec, ParamGroup
from ._base import SessionEstimator, new_session, store_params, validate_data

_ONNX_ACTIVATION = {"relu": "Relu", "logistic": "Sigmoid", "tanh": "Tanh", "identity": None}
_OPSET = 18


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def build_mlp(coefs, intercepts, activation, *, head=None, classes=None):
    """The network as an ONNX model: input "X", Gemm per layer (weights "coef_<i>" [fan_in, fan_out], biases
    "intercept_<i>"), the hidden activation after each hidden layer. head=None: one output "logits" (the output
    layer before its activation; what the loss reads). head="identity": output "predictions". head="softmax" or
    "logistic": outputs "label" (classes[argmax] or classes[p > 0.5]; multilabel: 0/1 indicators) and
    "probabilities" (predict_proba's layout)."""
    dtype = coefs[0].dtype
    elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    nodes, inits = [], []
    h = "X"
    for i, (w, b) in enumerate(zip(coefs, intercepts)):
        inits += [numpy_helper.from_array(np.asarray(w), f"coef_{i}"), numpy_helper.from_array(np.asarray(b), f"intercept_{i}")]
        out = f"layer_{i}"
        nodes.append(helper.make_node("Gemm", [h, f"coef_{i}", f"intercept_{i}"], [out], name=f"gemm_{i}"))
        h = out
        if i < len(coefs) - 1 and _ONNX_ACTIVATION[activation]:
            nodes.append(helper.make_node(_ONNX_ACTIVATION[activation], [h], [f"act_{i}"], name=f"act_{i}"))
            h = f"act_{i}"
    n_in, n_out = coefs[0].shape[0], coefs[-1].shape[1]
    outputs = []
    if head is None or head == "identity":
        name = "logits" if head is None else "predictions"
        nodes.append(helper.make_node("Identity", [h], [name], name="output"))
        outputs.append(helper.make_tensor_value_info(name, elem, ["N", n_out]))
    elif head == "softmax":
        nodes.append(helper.make_node("Softmax", [h], ["probabilities"], name="softmax", axis=1))
        nodes.append(helper.make_node("ArgMax", ["probabilities"], ["class_index"], name="argmax", axis=1, keepdims=0))
        outputs.append(_label_output(nodes, inits, "class_index", classes))
        outputs.append(helper.make_tensor_value_info("probabilities", elem, ["N", n_out]))
    elif head == "logistic":
        nodes.append(helper.make_node("Sigmoid", [h], ["p"], name="sigmoid"))
        inits.append(numpy_helper.from_array(np.array(0.5, dtype), "half"))
        nodes.append(helper.make_node("Greater", ["p", "half"], ["positive"], name="threshold"))
        nodes.append(helper.make_node("Cast", ["positive"], ["indicator"], name="indicator", to=TensorProto.INT64))
        if n_out == 1:  # binary: classes[p > 0.5], probabilities [1 - p, p]
            inits.append(numpy_helper.from_array(np.array([-1], np.int64), "flat"))
            nodes.append(helper.make_node("Reshape", ["indicator", "flat"], ["class_index"], name="flatten"))
            outputs.append(_label_output(nodes, inits, "class_index", classes))
            inits.append(numpy_helper.from_array(np.array(1, dtype), "one"))
            nodes.append(helper.make_node("Sub", ["one", "p"], ["q"], name="complement"))
            nodes.append(helper.make_node("Concat", ["q", "p"], ["probabilities"], name="proba", axis=1))
            outputs.append(helper.make_tensor_value_info("probabilities", elem, ["N", 2]))
        else:  # multilabel indicators
            nodes.append(helper.make_node("Identity", ["indicator"], ["label"], name="label"))
            nodes.append(helper.make_node("Identity", ["p"], ["probabilities"], name="proba"))
            outputs.append(helper.make_tensor_value_info("label", TensorProto.INT64, ["N", n_out]))
            outputs.append(helper.make_tensor_value_info("probabilities", elem, ["N", n_out]))
    else:
        raise ValueError(f"unknown head {head!r}")
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", elem, ["N", n_in])], outputs,
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="onnxtrain.sklearn")
    model.ir_version = 8
    return model


def _label_output(nodes, inits, index, classes):
    classes = np.asarray(classes)
    if classes.dtype.kind in "iub":
        values, elem = classes.astype(np.int64), TensorProto.INT64
    elif classes.dtype.kind == "f":
        values, elem = classes.astype(np.float64), TensorProto.DOUBLE
    else:
        values, elem = classes.astype(str).astype(object), TensorProto.STRING
    if elem == TensorProto.STRING:
        inits.append(helper.make_tensor("classes", TensorProto.STRING, [len(values)], [str(v).encode() for v in values]))
    else:
        inits.append(numpy_helper.from_array(values, "classes"))
    nodes.append(helper.make_node("Gather", ["classes", index], ["label"], name="label", axis=0))
    return helper.make_tensor_value_info("label", elem, ["N"])


class _BaseMLP(SessionEstimator):
    _parameter_constraints: dict = {
        "hidden_layer_sizes": ["array-like", Interval(Integral, 1, None, closed="left")],
        "activation": [StrOptions({"identity", "logistic", "tanh", "relu"})],
        "solver": [StrOptions({"sgd", "adam"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "momentum": [Interval(Real, 0, 1, closed="both")],
        "nesterovs_momentum": ["boolean"],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "beta_1": [Interval(Real, 0, 1, closed="left")],
        "beta_2": [Interval(Real, 0, 1, closed="left")],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left"), Options(Real, {np.inf})],
        "device": [str, None],  # checked by the session (parse_device): "cpu", "cuda", "cuda:N"; None: the default
        "on_non_finite": [StrOptions({"raise", "skip"})],
        "replicas": [Interval(Integral, 1, 64, closed="both")],
    }

    _input_name = "X"

    # Fitting ------------------------------------------------------------------------------------------------
    def fit(self, X, y, sample_weight=None):
        """Fits the network on (X, y); sample_weight scales each sample's loss (weighted mean, as sklearn)."""
        self._validate_params()
        return self._fit(X, y, sample_weight, incremental=False)

    def _fit(self, X, y, sample_weight, incremental):
        sizes = self.hidden_layer_sizes
        sizes = list(sizes) if hasattr(sizes, "__iter__") else [sizes]
        if any(s <= 0 for s in sizes):
            raise ValueError("hidden_layer_sizes must be > 0, got %s." % sizes)
        first_pass = not hasattr(self, "coefs_") or (not self.warm_start and not incremental)
        X, Y, y_raw = self._validate_input(X, y, incremental, reset=first_pass)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X)
        self.n_outputs_ = self._n_outputs(Y)
        layer_units = [X.shape[1]] + sizes + [self.n_outputs_]
        rs = self._random_state = check_random_state(self.random_state)
        if first_pass:
            self.n_layers_ = len(layer_units)
            self.out_activation_ = self._out_activation()
            coefs, intercepts = [], []
            for fan_in, fan_out in zip(layer_units[:-1], layer_units[1:]):
                c, b = self._init_coef(fan_in, fan_out, X.dtype, rs)
                coefs.append(c)
                intercepts.append(b)
            self._new_session(coefs, intercepts, X.shape[0], sample_weight)
        elif not incremental:
            # warm_start: the trained weights, a fresh optimizer (as scikit-learn).
            self._new_session(self.coefs_, self.intercepts_, X.shape[0], sample_weight)
        self._fit_loop(X, Y, y_raw, sample_weight, incremental, first_pass, rs)
        return self

    def _init_coef(self, fan_in, fan_out, dtype, rs):
        factor = 2.0 if self.activation == "logistic" else 6.0
        bound = np.sqrt(factor / (fan_in + fan_out))
        coef = rs.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype, copy=False)
        intercept = rs.uniform(-bound, bound, fan_out).astype(dtype, copy=False)
        return coef, intercept

    def _new_session(self, coefs, intercepts, n_samples, sample_weight):
        coefs = [np.ascontiguousarray(c) for c in coefs]
        intercepts = [np.ascontiguousarray(b) for b in intercepts]
        model = build_mlp(coefs, intercepts, self.activation)
        # scikit-learn divides alpha by each batch's weight sum; the decay is a constant of the optimizer graph,
        # so it uses the weight sum of a full batch on average (exact for full-batch and unweighted training but
        # for the last, smaller batch of an epoch).
        batch = self._effective_batch_size(n_samples) if n_samples else 1
        if sample_weight is not None and np.mean(sample_weight) > 0:
            batch = batch * float(np.mean(sample_weight))
        opt = OptimizerSpec(learning_rate=float(self.learning_rate_init))
        if self.solver == "sgd":
            opt.kind = "sgd"
            opt.momentum = float(self.momentum)
            opt.nesterov = bool(self.nesterovs_momentum and self.momentum > 0)
        else:
            opt.kind = "adam"
            opt.beta1, opt.beta2, opt.eps = float(self.beta_1), float(self.beta_2), float(self.epsilon)
        # alpha/2 * ||W||^2 / n per batch has gradient alpha/n * W: coupled weight decay, intercepts exempt.
        opt.weight_decay = float(self.alpha) / batch
        opt.groups = [ParamGroup(match=["intercept_*"], weight_decay=0.0)]
        self._session = new_session(self, model, trainable=None, loss=self._loss_spec(), optimizer=opt,
                                        device=self.device, on_non_finite=self.on_non_finite,
                                        replicas=self.replicas)
        self._sample_weight_dtype = coefs[0].dtype
        self._set_coefs(coefs, intercepts)

    def _set_coefs(self, coefs, intercepts):
        self.coefs_ = [np.array(c) for c in coefs]
        self.intercepts_ = [np.array(b) for b in intercepts]

    def _fitted_from_session(self):
        w = self._session.weights()
        n = len(self.coefs_)
        self._set_coefs([w[f"coef_{i}"] for i in range(n)], [w[f"intercept_{i}"] for i in range(n)])

    def _batch_penalty(self, n, squares=None):
        if self.alpha == 0:
            return 0.0
        if squares is None:
            w = self._session.weights()
            squares = sum(float(np.dot(w[f"coef_{i}"].ravel(), w[f"coef_{i}"].ravel())) for i in range(len(self.coefs_)))
        return 0.5 * self.alpha * squares / n

    def _penalty_weights(self):
        return [f"coef_{i}" for i in range(len(self.coefs_))] if self.alpha != 0 else []

    def _epoch_end(self):
        if self.solver == "sgd" and self.learning_rate == "invscaling":
            self._session.learning_rate = self.learning_rate_init / (self.t_ + 1) ** self.power_t

    def _trigger_stopping(self, msg):
        if self.solver != "sgd" or self.learning_rate != "adaptive":
            return super()._trigger_stopping(msg)
        lr = self._session.learning_rate
        if lr <= 1e-6:
            if self.verbose:
                print(msg + " Learning rate too small. Stopping.")
            return True
        self._session.learning_rate = lr / 5.0
        if self.verbose:
            print(msg + " Setting learning rate to %f" % (lr / 5.0))
        return False

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over (X, y), continuing the current weights and optimizer state."""
        if not hasattr(self, "coefs_"):
            self._validate_params()
        return self._fit(X, y, sample_weight, incremental=True)

    # Predicting ---------------------------------------------------------------------------------------------
    def _forward(self, X):
        """The output layer before its activation, computed by onnxtrain."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse=["csr", "csc"], reset=False, dtype=(np.float64, np.float32))
        X = X.astype(self.coefs_[0].dtype, copy=False)
        if hasattr(X, "toarray"):
            X = X.toarray()
        return self._session.infer({"X": np.ascontiguousarray(X)})[0]

    @property
    def model_(self):
        """The fitted network as an ONNX model ready to deploy (onnx.ModelProto; see build_mlp for its outputs)."""
        check_is_fitted(self)
        return build_mlp(self.coefs_, self.intercepts_, self.activation, head=self.out_activation_,
                         classes=getattr(self, "classes_", None))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class MLPRegressor(RegressorMixin, _BaseMLP):
    """Multi-layer perceptron regressor, trained by onnxtrain (scikit-learn's MLPRegressor API).

    Same parameters and defaults as ``sklearn.neural_network.MLPRegressor`` except ``solver``: 'adam' or 'sgd'
    ('lbfgs' is not available) and ``loss``: 'squared_error' only. ``device``: 'cpu', 'cuda' or 'cuda:N' (None:
    $ONNXTRAIN_DEVICE, else 'cpu').
    ``on_non_finite``: 'raise' (default: a NaN/Inf loss or gradient raises OnnxtrainError naming the step and the
    tensor) or 'skip' (that batch's update is not applied, a NonFiniteStepWarning names it, ``n_skipped_steps_``
    counts it and ``loss_`` averages the other batches). ``replicas``: split each batch over that many one-thread
    replicas of the network (docs/replicas.md; the same fit up to float rounding), 1 = one session on OpenMP's
    threads.
    The fitted network is ``model_`` (ONNX: input "X", output "predictions").
    """

    _parameter_constraints: dict = {**_BaseMLP._parameter_constraints, "loss": [StrOptions({"squared_error"})]}

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, loss="squared_error", solver="adam",
                 alpha=0.0001, batch_size="auto", learning_rate="constant", learning_rate_init=0.001, power_t=0.5,
                 max_iter=200, shuffle=True, random_state=None, tol=1e-4, verbose=False, warm_start=False,
                 momentum=0.9, nesterovs_momentum=True, early_stopping=False, validation_fraction=0.1, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-8, n_iter_no_change=10, device=None, on_non_finite="raise", replicas=1):
        store_params(self, locals())

    def _validate_input(self, X, y, incremental, reset):
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], multi_output=True, y_numeric=True,
                             dtype=(np.float64, np.float32), reset=reset)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        Y = np.ascontiguousarray((y.reshape(-1, 1) if y.ndim == 1 else y).astype(X.dtype))
        return X, Y, y

    def _n_outputs(self, Y):
        return Y.shape[1]

    def _out_activation(self):
        return "identity"

    def _loss_spec(self):
        # scikit-learn's squared_loss: 0.5 * mean over samples and outputs.
        return LossSpec(kind="square", half=True, sample_weight=True)

    def _score_raw(self, X, y, sample_weight):
        return r2_score(y, self._predict_raw(X), sample_weight=sample_weight)

    def _predict_raw(self, X):
        y = self._session.infer({"X": np.ascontiguousarray(X.toarray() if hasattr(X, "toarray") else X)})[0]
        return y.ravel() if self.n_outputs_ == 1 else y

    def predict(self, X):
        """Predictions of the network (computed by onnxtrain)."""
        y = self._forward(X)
        return y.ravel() if self.n_outputs_ == 1 else y


class MLPClassifier(ClassifierMixin, _BaseMLP):
    """Multi-layer perceptron classifier, trained by onnxtrain (scikit-learn's MLPClassifier API).

    Same parameters and defaults as ``sklearn.neural_network.MLPClassifier`` except ``solver``: 'adam' or 'sgd'
    ('lbfgs' is not available). ``device``: 'cpu', 'cuda' or 'cuda:N' (None: $ONNXTRAIN_DEVICE, else 'cpu').
    ``on_non_finite`` and ``replicas``: as MLPRegressor's.
    Multiclass trains softmax cross-entropy on the logits,
    binary and multilabel the logistic log-loss on the logits (the gradients scikit-learn uses). The fitted
    network is ``model_`` (ONNX: input "X", outputs "label" and "probabilities").
    """

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, solver="adam", alpha=0.0001,
                 batch_size="auto", learning_rate="constant", learning_rate_init=0.001, power_t=0.5, max_iter=200,
                 shuffle=True, random_state=None, tol=1e-4, verbose=False, warm_start=False, momentum=0.9,
                 nesterovs_momentum=True, early_stopping=False, validation_fraction=0.1, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, n_iter_no_change=10, device=None, on_non_finite="raise", replicas=1):
        store_params(self, locals())

    def _validate_input(self, X, y, incremental, reset):
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], multi_output=True,
                             dtype=(np.float64, np.float32), reset=reset)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        if not hasattr(self, "classes_") or (not self.warm_start and not incremental):
            self._label_binarizer = LabelBinarizer()
            self._label_binarizer.fit(y)
            self.classes_ = self._label_binarizer.classes_
        else:
            classes = unique_labels(y)
            if self.warm_start:
                if set(classes) != set(self.classes_):
                    raise ValueError("warm_start can only be used where `y` has the same classes as in the previous "
                                     f"call to fit. Previously got {self.classes_}, `y` has {classes}")
            elif len(np.setdiff1d(classes, self.classes_, assume_unique=True)):
                raise ValueError(f"`y` has classes not in `self.classes_`. `self.classes_` has {self.classes_}. "
                                 f"'y' has {classes}.")
        Yb = self._label_binarizer.transform(y)
        if self._label_binarizer.y_type_ == "multiclass":
            Y = np.ascontiguousarray(np.argmax(Yb, axis=1).astype(np.int64))
        else:
            Y = np.ascontiguousarray(Yb.astype(X.dtype))
        return X, Y, y

    def _multiclass(self):
        return self._label_binarizer.y_type_ == "multiclass"

    def _n_outputs(self, Y):
        return len(self.classes_) if self._multiclass() else Y.shape[1]

    def _out_activation(self):
        return "softmax" if self._multiclass() else "logistic"

    @property
    def _loss_reduction(self):
        return "mean" if self._multiclass() else "sum"

    def _loss_spec(self):
        if self._multiclass():
            return LossSpec(kind="cross_entropy", sample_weight=True, ignore_index=None)
        # binary_log_loss sums over outputs and divides by the samples: "sum" with weights 1/n.
        return LossSpec(kind="neg_log", input="logits", reduction="sum", sample_weight=True)

    def _stratify(self, y_raw):
        # As scikit-learn: only single-output problems (binary) are stratified, on the binarized target.
        return self._label_binarizer.transform(y_raw).astype(bool) if self.n_outputs_ == 1 else None

    def _proba_from_logits(self, z):
        if self._multiclass():
            return _softmax(z)
        p = _sigmoid(z)
        return np.hstack([1 - p, p]) if p.shape[1] == 1 else p

    def _labels_from_logits(self, z):
        if self._multiclass():
            return self.classes_[np.argmax(z, axis=1)]
        p = _sigmoid(z)
        return self._label_binarizer.inverse_transform(p.ravel() if p.shape[1] == 1 else p)

    def _score_raw(self, X, y, sample_weight):
        z = self._session.infer({"X": np.ascontiguousarray(X.toarray() if hasattr(X, "toarray") else X)})[0]
        return accuracy_score(y, self._labels_from_logits(z), sample_weight=sample_weight)

    def predict(self, X):
        """Predicted classes (computed by onnxtrain)."""
        return self._labels_from_logits(self._forward(X))

    def predict_proba(self, X):
        """Class probabilities, in the order of classes_ (binary: [1 - p, p])."""
        return self._proba_from_logits(self._forward(X))

    def predict_log_proba(self, X):
        """log(predict_proba(X))."""
        p = self.predict_proba(X)
        return np.log(p, out=p)

    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """One epoch over (X, y). classes (all classes of the problem) is required on the first call."""
        if _check_partial_fit_first_call(self, classes):
            self._label_binarizer = LabelBinarizer()
            if type_of_target(y).startswith("multilabel"):
                self._label_binarizer.fit(y)
            else:
                self._label_binarizer.fit(classes)
        return super().partial_fit(X, y, sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags
