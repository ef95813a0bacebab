import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release"))
    if not (d / "examples" / "train_mlp").exists():
        pytest.fail(f"no build in {d}: run scripts/build.sh (or set ONNXTRAIN_BUILD_DIR)")
    return d
