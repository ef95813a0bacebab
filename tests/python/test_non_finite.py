"""The sklearn estimators report a non-finite step clearly (issue 12, docs/reliability.md): the error names the
step and the tensor that went NaN/Inf, and the update of that step is not applied."""
import numpy as np
import pytest

import onnxtrain
from onnxtrain.sklearn import MLPClassifier, MLPRegressor


def _diverging_data():
    rng = np.random.RandomState(0)
    X = rng.randn(64, 4).astype(np.float32)
    return X, X.sum(axis=1) * 1e30  # squared error overflows float32 on the first step


def test_regressor_names_the_step_and_the_tensor():
    X, y = _diverging_data()
    est = MLPRegressor(hidden_layer_sizes=(8,), max_iter=3, random_state=0)
    with pytest.raises(onnxtrain.OnnxtrainError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert "training step 1" in msg and "optimizer step 1" in msg
    assert "'loss'" in msg and "not finite" in msg and "was not applied" in msg


def test_classifier_with_an_overflowing_learning_rate_names_the_tensor():
    rng = np.random.RandomState(1)
    X = (rng.randn(64, 4) * 1e18).astype(np.float32)
    y = rng.randint(0, 3, size=64)
    est = MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, learning_rate_init=1e20, random_state=0)
    with pytest.raises(onnxtrain.OnnxtrainError) as info:
        est.fit(X, y)
    msg = str(info.value)
    assert "training step" in msg and "not finite" in msg
    assert "'loss'" in msg or "gradient of" in msg
