import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("ONNXTRAIN_BUILD_DIR", ROOT / "build" / "release"))
# The Python package as the CMake build lays it out (python/CMakeLists.txt): the native module beside symlinks
# to python/onnxtrain/*.py. Tests import it from there rather than from an installed copy (docs/python.md).
PYTHON_DIR = BUILD_DIR / "python"
if (PYTHON_DIR / "onnxtrain").is_dir():
    sys.path.insert(0, str(PYTHON_DIR))


@pytest.fixture(scope="session")
def build_dir():
    d = BUILD_DIR
    if not (d / "examples" / "train_mlp").exists():
        pytest.fail(f"no build in {d}: run scripts/build.sh (or set ONNXTRAIN_BUILD_DIR)")
    return d


@pytest.fixture(scope="session")
def python_env():
    """The environment for a subprocess that imports onnxtrain from the build tree."""
    if not list((PYTHON_DIR / "onnxtrain").glob("_onnxtrain*.so")):
        pytest.fail(f"no Python module in {PYTHON_DIR}: build with scripts/build.sh (ONNXTRAIN_BUILD_PYTHON=ON)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    return env
