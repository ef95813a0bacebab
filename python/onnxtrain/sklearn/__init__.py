"""scikit-learn estimators trained by onnxtrain (docs/python.md).

- OnnxRegressor, OnnxClassifier: fine-tune a given ONNX model (a path, bytes or onnx.ModelProto), for instance
  one converted from scikit-learn with skl2onnx; training starts from the model's own weights.
- MLPRegressor, MLPClassifier: drop-in replacements for scikit-learn's, built as ONNX and trained natively;
  ``model_`` is the ONNX model to deploy.
"""
from .. import Elastic
from ._mlp import MLPClassifier, MLPRegressor, build_mlp
from ._onnx import OnnxClassifier, OnnxRegressor

__all__ = ["Elastic", "MLPClassifier", "MLPRegressor", "OnnxClassifier", "OnnxRegressor", "build_mlp"]
