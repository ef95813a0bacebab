"""onnxtrain.sklearn.MLPRegressor/MLPClassifier against scikit-learn's, with the same hyper-parameters, on the
datasets scikit-learn ships: R2 (diabetes) and accuracy (digits, breast_cancer) on a held-out quarter.

    python examples/python/mlp_parity.py [--max-iter 200]
"""
import argparse
import warnings

import sklearn.neural_network as sknn
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import onnxtrain.sklearn as ots

CASES = [("diabetes", load_diabetes, "MLPRegressor"), ("digits", load_digits, "MLPClassifier"),
         ("breast_cancer", load_breast_cancer, "MLPClassifier")]
# Hyper-parameter sets, each passed unchanged to both implementations (the rest are scikit-learn's defaults).
# diabetes' target is in the hundreds: the default learning rate needs thousands of epochs, so 0.01.
CONFIGS = {
    "adam": {"diabetes": dict(learning_rate_init=0.01)},
    "sgd": {"*": dict(solver="sgd", learning_rate="adaptive", momentum=0.9, early_stopping=True),
            "diabetes": dict(learning_rate_init=1e-4)},
}


def params_for(config, dataset):
    c = CONFIGS[config]
    return {**c.get("*", {}), **c.get(dataset, {})}


def compare(config="adam", max_iter=200):
    """Rows of (dataset, metric, scikit-learn score, onnxtrain score)."""
    rows = []
    for name, load, cls in CASES:
        X, y = load(return_X_y=True)
        X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
        scores = []
        for module in (sknn, ots):
            est = getattr(module, cls)(max_iter=max_iter, random_state=0, **params_for(config, name))
            model = make_pipeline(StandardScaler(), est)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model.fit(X_train, y_train)
            scores.append(model.score(X_test, y_test))
        rows.append((name, "R2" if cls == "MLPRegressor" else "accuracy", *scores))
    return rows


def main(configs, max_iter):
    print("| solver | dataset | metric | scikit-learn | onnxtrain | difference |")
    print("|---|---|---|---|---|---|")
    out = {}
    for config in configs:
        out[config] = compare(config, max_iter)
        for name, metric, theirs, ours in out[config]:
            print(f"| {config} | {name} | {metric} | {theirs:.4f} | {ours:.4f} | {ours - theirs:+.4f} |", flush=True)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-iter", type=int, default=200)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = p.parse_args()
    main(args.configs, args.max_iter)
