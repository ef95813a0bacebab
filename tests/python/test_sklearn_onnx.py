"""OnnxRegressor / OnnxClassifier: fine-tuning models converted by skl2onnx (the onnxcustom workflow), the
exported model in onnxruntime, starting from the model's own weights, trainable subsets, losses, checkpoints,
scikit-learn tooling (clone, GridSearchCV, pickle) and errors."""
import pickle
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from skl2onnx import to_onnx
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.neural_network import MLPClassifier as SkMLPClassifier, MLPRegressor as SkMLPRegressor
from sklearn.preprocessing import StandardScaler

import onnxtrain as ot
from conftest import ROOT
from onnxtrain.sklearn import Elastic, OnnxClassifier, OnnxRegressor, build_mlp

warnings.filterwarnings("ignore", category=ConvergenceWarning)


def ort_run(model, X):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": X})


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    return train_test_split(X, (y / 100).astype(np.float32), random_state=0)


@pytest.fixture(scope="module")
def regressor_onnx(diabetes):
    X_train, _, y_train, _ = diabetes
    sk = SkMLPRegressor(hidden_layer_sizes=(16,), max_iter=20, random_state=0).fit(X_train, y_train)
    return sk, to_onnx(sk, X_train[:1], target_opset=18)


def test_finetune_example_runs(python_env, tmp_path):
    out = subprocess.run([sys.executable, ROOT / "examples" / "python" / "finetune_skl2onnx.py", "--out",
                          tmp_path / "ft.onnx"], check=True, capture_output=True, text=True, env=python_env).stdout
    before, after = [float(v) for v in out.splitlines()[0].split("scikit-learn ")[1].split(", fine-tuned ")]
    assert after > before + 0.05, out  # fine-tuning improved the converted model
    assert float(out.splitlines()[-1].split("= ")[1]) < 1e-4, out
    onnx.checker.check_model(onnx.load(tmp_path / "ft.onnx"), full_check=True)


def test_regressor_workflow_with_elastic_penalty(diabetes, regressor_onnx):
    X_train, X_test, y_train, y_test = diabetes
    sk, onx = regressor_onnx
    est = OnnxRegressor(onx, loss="square", optimizer="nesterov", momentum=0.9, learning_rate=1e-3,
                        penalty=Elastic(l1=1e-5, l2=1e-4), max_iter=40, batch_size=32, random_state=0).fit(X_train, y_train)
    assert est.score(X_test, y_test) > sk.score(X_test, y_test)
    assert est.loss_curve_[-1] < est.loss_curve_[0] and est.n_iter_ == 40 and est.n_features_in_ == 10
    assert est.validation_scores_ is None
    (theirs,) = ort_run(est.model_, X_test)
    np.testing.assert_allclose(theirs.ravel(), est.predict(X_test), rtol=1e-5, atol=1e-5)
    # The input model is untouched, and the exported one has the same graph with new weights.
    assert [n.op_type for n in est.model_.graph.node] == [n.op_type for n in onx.graph.node]
    np.testing.assert_allclose(ort_run(onx, X_test)[0].ravel(), sk.predict(X_test), rtol=1e-5, atol=1e-5)


def test_fit_starts_from_the_model_weights(diabetes, regressor_onnx):
    X_train, X_test, y_train, _ = diabetes
    sk, onx = regressor_onnx
    # A vanishing learning rate leaves the model as converted: fine-tuning does not reinitialise anything.
    est = OnnxRegressor(onx, optimizer="sgd", learning_rate=1e-12, max_iter=1).fit(X_train, y_train)
    np.testing.assert_allclose(est.predict(X_test), sk.predict(X_test), rtol=1e-4, atol=1e-4)
    # warm_start=False: every fit starts again from the model; warm_start=True continues.
    cold = OnnxRegressor(onx, optimizer="adam", learning_rate=1e-2, max_iter=3, random_state=0)
    first = cold.fit(X_train, y_train).predict(X_test)
    np.testing.assert_array_equal(cold.fit(X_train, y_train).predict(X_test), first)
    warm = clone(cold).set_params(warm_start=True)
    warm.fit(X_train, y_train)
    warm.fit(X_train, y_train)
    assert warm.n_iter_ == 6 and np.abs(warm.predict(X_test) - first).max() > 1e-4


def test_trainable_regex_freezes_the_rest(diabetes, regressor_onnx):
    X_train, _, y_train, _ = diabetes
    _, onx = regressor_onnx
    names = [i.name for i in onx.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    assert {"coefficient", "coefficient1", "intercepts", "intercepts1"} <= set(names)
    est = OnnxRegressor(onx, trainable=r"1$", optimizer="adam", learning_rate=1e-2, max_iter=3).fit(X_train, y_train)
    before = {i.name: numpy_helper.to_array(i) for i in onx.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in est.model_.graph.initializer}
    assert np.array_equal(after["coefficient"], before["coefficient"])
    assert np.array_equal(after["intercepts"], before["intercepts"])
    assert not np.array_equal(after["coefficient1"], before["coefficient1"])


@pytest.mark.parametrize("dataset", ["iris", "breast_cancer"])
def test_classifier_workflow(dataset):
    X, y = (load_iris if dataset == "iris" else load_breast_cancer)(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0, stratify=y)
    sk = SkMLPClassifier(hidden_layer_sizes=(8,), max_iter=15, random_state=0).fit(X_train, y_train)
    onx = to_onnx(sk, X_train[:1], target_opset=18, options={"zipmap": False})
    est = OnnxClassifier(onx, loss="neg_log", optimizer="adam", learning_rate=1e-2, max_iter=30, random_state=0,
                         early_stopping=True, n_iter_no_change=30).fit(X_train, y_train)
    assert est.score(X_test, y_test) >= sk.score(X_test, y_test)
    assert len(est.validation_scores_) == est.n_iter_ and est.loss_curve_[-1] < est.loss_curve_[0]
    np.testing.assert_array_equal(est.classes_, np.unique(y))
    label, proba = ort_run(est.model_, X_test)  # label extraction (ArrayFeatureExtractor) kept for deployment
    np.testing.assert_array_equal(label, est.predict(X_test))
    np.testing.assert_allclose(proba, est.predict_proba(X_test), rtol=1e-5, atol=1e-6)


def test_classifier_on_logits_with_cross_entropy():
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    rs = np.random.RandomState(0)
    logits_model = build_mlp([rs.randn(4, 8).astype(np.float32) * 0.5, rs.randn(8, 3).astype(np.float32) * 0.5],
                             [np.zeros(8, np.float32), np.zeros(3, np.float32)], "tanh")
    est = OnnxClassifier(logits_model, loss="cross_entropy", optimizer="adam", learning_rate=0.05, max_iter=50,
                         random_state=0).fit(X, np.array(["a", "b", "c"])[y])
    assert est.score(X, np.array(["a", "b", "c"])[y]) > 0.9
    p = est.predict_proba(X)
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-6)  # softmax of the logits


def test_checkpoint_grid_search_and_pickle(diabetes, regressor_onnx, tmp_path):
    X_train, X_test, y_train, y_test = diabetes
    _, onx = regressor_onnx
    grid = GridSearchCV(OnnxRegressor(onx, optimizer="adam", max_iter=5, random_state=0),
                        {"learning_rate": [1e-3, 1e-2]}, cv=2).fit(X_train, y_train)
    best = grid.best_estimator_
    assert best.get_params()["model"] is not onx  # clone deep-copies the ModelProto parameter
    best.save_checkpoint(tmp_path / "ck.onnx")
    resumed = ot.TrainingSession.from_checkpoint(tmp_path / "ck.onnx")
    np.testing.assert_allclose(resumed.infer({"X": X_test})[0].ravel(), best.predict(X_test), rtol=1e-6)
    restored = pickle.loads(pickle.dumps(best))
    np.testing.assert_array_equal(restored.predict(X_test), best.predict(X_test))
    restored.partial_fit(X_train, y_train)
    assert restored.n_iter_ == best.n_iter_ + 1


def test_errors_name_the_problem(diabetes, regressor_onnx, tmp_path):
    X_train, _, y_train, _ = diabetes
    _, onx = regressor_onnx
    with pytest.raises(ValueError, match="prediction: 'nope' is not an output of the model"):
        OnnxRegressor(onx, prediction="nope").fit(X_train, y_train)
    with pytest.raises(ValueError, match="trainable: the pattern 'xyz' matches no floating-point initializer"):
        OnnxRegressor(onx, trainable="xyz").fit(X_train, y_train)
    with pytest.raises(ValueError, match="input 'X': expected shape"):
        OnnxRegressor(onx).fit(X_train[:, :5], y_train)
    with pytest.raises(ValueError, match="loss.kind: unknown value 'hinge'"):
        OnnxRegressor(onx, loss="hinge").fit(X_train, y_train)
    with pytest.raises(TypeError, match="model: expected a path, bytes or onnx.ModelProto"):
        OnnxRegressor(42).fit(X_train, y_train)
    X, y = load_iris(return_X_y=True)
    sk = SkMLPClassifier(hidden_layer_sizes=(4,), max_iter=5, random_state=0).fit(X.astype(np.float32), y)
    onx3 = to_onnx(sk, X[:1].astype(np.float32), target_opset=18, options={"zipmap": False})
    with pytest.raises(ValueError, match="prediction 'probabilities' has 3 columns but y has 2 classes"):
        OnnxClassifier(onx3).fit(X[y < 2], y[y < 2])
    # ... which partial_fit(classes=...) resolves.
    OnnxClassifier(onx3).partial_fit(X[y < 2], y[y < 2], classes=[0, 1, 2])
    path = tmp_path / "model.onnx"
    onnx.save(onx3, path)
    assert OnnxClassifier(str(path), max_iter=2).fit(X, y).n_iter_ == 2  # a path works too
