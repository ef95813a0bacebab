"""onnxtrain.sklearn.MLPRegressor / MLPClassifier: scikit-learn's estimator checks, the same training
trajectory as scikit-learn's MLP (same initial weights, batches and updates), quality parity on the bundled
datasets (examples/python/mlp_parity.py), and the exported ONNX model in onnxruntime."""
import pickle
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import sklearn.neural_network as sknn
from sklearn.base import clone
from sklearn.datasets import load_digits, make_classification, make_multilabel_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from conftest import ROOT
from onnxtrain.sklearn import MLPClassifier, MLPRegressor

warnings.filterwarnings("ignore", category=ConvergenceWarning)


# max_iter=100 as scikit-learn's own test suite sets for its MLPs (sklearn/utils/_test_common/instance_generator.py);
# no check is exempted.
@parametrize_with_checks([MLPRegressor(max_iter=100), MLPClassifier(max_iter=100)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return StandardScaler().fit_transform(X), y


# Same data, same hyper-parameters, same random_state: the same initial weights, batches and updates as
# scikit-learn's MLP. Two approximations are kept out of the exact cases (docs/python.md, "Semantics"):
# - the L2 term is a constant weight decay alpha/B, exact only for full batches: the data here is 1600 samples
#   (8 batches of 200), and early stopping keeps 1400 for training (validation_fraction=0.125);
# - Adam adds epsilon where torch does (to sqrt(v) / sqrt(1 - beta2^t)), scikit-learn to sqrt(v): the difference
#   only matters for gradients near epsilon (~1e-8), so Adam is compared on what it predicts, to 1e-3.
@pytest.mark.parametrize("params", [
    dict(solver="adam"),
    dict(solver="adam", early_stopping=True, validation_fraction=0.125, activation="identity"),
    dict(solver="sgd", momentum=0.9, nesterovs_momentum=True),
    dict(solver="sgd", momentum=0.5, nesterovs_momentum=False, activation="tanh", alpha=0.01, batch_size=50),
    dict(solver="sgd", momentum=0.0, activation="logistic", shuffle=False),
    dict(solver="sgd", early_stopping=True, validation_fraction=0.125, learning_rate="adaptive"),
], ids=["adam", "adam-early-stopping", "nesterov", "momentum-tanh-l2", "sgd-logistic-noshuffle", "sgd-early-stopping"])
@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_same_trajectory_as_scikit_learn(digits, params, kind):
    X, y = digits
    X, y = X[:1600], y[:1600]
    if kind == "regressor":
        y = y.astype(np.float64) / 9
        ours, theirs, out = MLPRegressor, sknn.MLPRegressor, "predict"
    else:
        ours, theirs, out = MLPClassifier, sknn.MLPClassifier, "predict_proba"
    kw = dict(hidden_layer_sizes=(30, 20), max_iter=6, random_state=3, **params)
    a = theirs(**kw).fit(X, y)
    b = ours(**kw).fit(X, y)
    assert b.n_iter_ == a.n_iter_ == 6
    if params["solver"] == "sgd":
        for wa, wb in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
            np.testing.assert_allclose(wb, wa, rtol=1e-9, atol=1e-14)
        if params.get("early_stopping"):
            np.testing.assert_allclose(b.validation_scores_, a.validation_scores_, rtol=1e-9)
    np.testing.assert_allclose(getattr(b, out)(X), getattr(a, out)(X), rtol=1e-3 if params["solver"] == "adam" else 1e-9,
                               atol=1e-3 if params["solver"] == "adam" else 1e-12)
    # train_step returns the loss in float32, and scikit-learn clips probabilities below machine epsilon in its loss
    # value (not in its gradients), hence the tolerance on the curve.
    np.testing.assert_allclose(b.loss_curve_, a.loss_curve_, rtol=1e-3 if params["solver"] == "adam" else 1e-4)


def test_quality_parity_example(python_env):
    out = subprocess.run([sys.executable, ROOT / "examples" / "python" / "mlp_parity.py"], check=True,
                         capture_output=True, text=True, env=python_env).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "solver" not in line]
    assert len(rows) == 6, out
    for solver, dataset, metric, theirs, ours, _ in rows:
        theirs, ours = float(theirs), float(ours)
        assert theirs > (0.25 if dataset.strip() == "diabetes" else 0.85), out  # both models really learned
        assert abs(ours - theirs) <= 0.02, out


@pytest.mark.parametrize("labels", ["int", "str", "binary", "multilabel"])
def test_exported_classifier_runs_in_onnxruntime(labels):
    if labels == "multilabel":
        X, y = make_multilabel_classification(n_samples=120, n_features=6, n_classes=3, random_state=0)
    else:
        X, y = make_classification(n_samples=150, n_features=6, n_informative=4, random_state=0,
                                   n_classes=2 if labels == "binary" else 3)
        if labels == "str":
            y = np.array(["cat", "dog", "eel"])[y]
    X = X.astype(np.float32)
    clf = MLPClassifier(hidden_layer_sizes=(16,), learning_rate_init=0.01, max_iter=200, random_state=0).fit(X, y)
    assert clf.score(X, y) > (0.5 if labels == "multilabel" else 0.9)  # it learned (subset accuracy for multilabel)
    sess = ort.InferenceSession(clf.model_.SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba = sess.run(None, {"X": X})
    np.testing.assert_allclose(proba, clf.predict_proba(X), rtol=1e-5, atol=1e-6)
    if labels == "str":
        label = label.astype(str)
    np.testing.assert_array_equal(label, clf.predict(X))


def test_exported_regressor_runs_in_onnxruntime():
    X, y = make_regression(n_samples=100, n_features=5, n_targets=2, random_state=0)
    reg = MLPRegressor(hidden_layer_sizes=(8,), max_iter=30, random_state=0).fit(X, y)
    (pred,) = ort.InferenceSession(reg.model_.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": X})
    assert pred.dtype == np.float64  # float64 input: the network is float64, as scikit-learn's
    np.testing.assert_allclose(pred, reg.predict(X), rtol=1e-10)


def test_pipeline_grid_search_clone_and_pickle():
    X, y = make_classification(n_samples=120, n_features=5, random_state=1)
    pipe = make_pipeline(StandardScaler(), MLPClassifier(max_iter=40, random_state=0))
    grid = GridSearchCV(pipe, {"mlpclassifier__hidden_layer_sizes": [(4,), (16,)], "mlpclassifier__alpha": [1e-4, 1e-2]},
                        cv=2).fit(X, y)
    assert set(grid.cv_results_["params"][0]) == {"mlpclassifier__hidden_layer_sizes", "mlpclassifier__alpha"}
    best = grid.best_estimator_
    c = clone(best[-1])
    assert c.get_params() == best[-1].get_params() and not hasattr(c, "coefs_")
    restored = pickle.loads(pickle.dumps(best))
    np.testing.assert_array_equal(restored.predict_proba(X), best.predict_proba(X))
    restored[-1].partial_fit(restored[0].transform(X), y)  # the restored session keeps training
    assert restored[-1].n_iter_ == best[-1].n_iter_ + 1


def test_warm_start_partial_fit_and_verbose(capsys):
    X, y = make_regression(n_samples=80, n_features=4, random_state=0)
    kw = dict(hidden_layer_sizes=(8,), solver="sgd", learning_rate_init=1e-4, random_state=0)
    reg = MLPRegressor(max_iter=5, warm_start=True, verbose=True, **kw).fit(X, y)
    first = [c.copy() for c in reg.coefs_]
    reg.fit(X, y)  # continues from the fitted weights
    out = capsys.readouterr().out
    assert out.count("Iteration 1, loss = ") == 1 and "Iteration 10, loss = " in out
    assert reg.n_iter_ == 10 and any(np.abs(a - b).max() > 0 for a, b in zip(first, reg.coefs_))
    cold = MLPRegressor(max_iter=10, **kw).fit(X, y)
    sk = sknn.MLPRegressor(max_iter=5, warm_start=True, **kw).fit(X, y).fit(X, y)
    np.testing.assert_allclose(reg.coefs_[0], sk.coefs_[0], rtol=1e-9)  # warm start as scikit-learn's
    assert np.abs(cold.coefs_[0] - reg.coefs_[0]).max() > 0  # a fresh optimizer on the second fit
    inc = MLPClassifier(hidden_layer_sizes=(8,), random_state=0)
    inc.partial_fit(X[:40], (y[:40] > 0).astype(int), classes=[0, 1])
    inc.partial_fit(X[40:], (y[40:] > 0).astype(int))
    assert inc.n_iter_ == 2 and list(inc.classes_) == [0, 1]


def test_unsupported_options_are_clear_errors():
    X, y = make_regression(n_samples=20, n_features=3, random_state=0)
    with pytest.raises(ValueError, match="'solver' parameter of MLPRegressor must be a str among"):
        MLPRegressor(solver="lbfgs").fit(X, y)
    with pytest.raises(ValueError, match="'loss' parameter of MLPRegressor"):
        MLPRegressor(loss="poisson").fit(X, y)
    with pytest.raises(ValueError, match="partial_fit does not support early_stopping"):
        MLPRegressor(early_stopping=True).partial_fit(X, y)
