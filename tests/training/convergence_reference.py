"""Reference for the convergence test of tests/training/test_optimizers.cpp (run with the project venv, which
has scikit-learn):

    python convergence_reference.py DIR

DIR holds x_train.npy, y_train.npy, x_test.npy, y_test.npy (labels 0/1) and pred_<optimizer>.npy, the test-set
logits of a logistic regression onnxtrain trained with that optimizer. scikit-learn's LogisticRegression (its
defaults: L2, C=1, lbfgs) is fitted on the same training data; every optimizer's test accuracy must be within
1 point of it. Exits 1 otherwise.
"""
import os
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression


def main(d):
    load = lambda n: np.load(os.path.join(d, n))
    xtr, ytr, xte, yte = load("x_train.npy"), load("y_train.npy").ravel(), load("x_test.npy"), load("y_test.npy").ravel()
    sk = LogisticRegression().fit(xtr, ytr)
    sk_acc = 100 * np.mean(sk.predict(xte) == yte)
    print(f"scikit-learn LogisticRegression: {sk_acc:.2f}% test accuracy")
    preds = sorted(f for f in os.listdir(d) if f.startswith("pred_"))
    bad = [] if preds else ["no predictions to check"]
    for f in preds:
        acc = 100 * np.mean((load(f).ravel() > 0) == (yte > 0.5))
        print(f"  {f[5:-4]}: {acc:.2f}% ({acc - sk_acc:+.2f})")
        if abs(acc - sk_acc) > 1.0:
            bad.append(f"{f[5:-4]}: {acc:.2f}% vs scikit-learn {sk_acc:.2f}%")
    print("\n".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
