"""The onnxcustom workflow with onnxtrain: train a scikit-learn MLPRegressor, convert it to ONNX with skl2onnx,
fine-tune the ONNX model with OnnxRegressor (Nesterov momentum, elastic penalty), and check that the exported
model runs in onnxruntime with the same predictions.

    python examples/python/finetune_skl2onnx.py [--out trained.onnx]
"""
import argparse
import warnings

import numpy as np
import onnxruntime as ort
from skl2onnx import to_onnx
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxtrain.sklearn import Elastic, OnnxRegressor


def main(out=None):
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(np.float32)
    y = (y / 100).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

    # 1. A scikit-learn model, trained briefly, converted with skl2onnx.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = MLPRegressor(hidden_layer_sizes=(32,), max_iter=30, random_state=0).fit(X_train, y_train)
    onx = to_onnx(sk, X_train[:1], target_opset=18)

    # 2. Fine-tune the ONNX model itself, starting from its weights.
    est = OnnxRegressor(onx, loss="square", optimizer="nesterov", momentum=0.9, learning_rate=1e-3,
                        penalty=Elastic(l1=1e-6, l2=1e-5), max_iter=100, batch_size=32, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X_train, y_train)
    print(f"R2 on the test set: scikit-learn {sk.score(X_test, y_test):.4f}, fine-tuned {est.score(X_test, y_test):.4f}")
    print(f"epochs {est.n_iter_}, training loss {est.loss_curve_[0]:.4f} -> {est.loss_curve_[-1]:.4f}")

    # 3. Predict, and export the trained model.
    ours = est.predict(X_test)
    trained = est.model_
    if out:
        with open(out, "wb") as f:
            f.write(trained.SerializeToString())

    # 4. onnxruntime runs the exported model with the same predictions.
    sess = ort.InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {"X": X_test})[0].ravel()
    print(f"max |onnxtrain - onnxruntime| = {np.abs(ours - theirs).max():.2e}")
    return sk.score(X_test, y_test), est.score(X_test, y_test), np.abs(ours - theirs).max()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="where to save the fine-tuned model")
    main(p.parse_args().out)
