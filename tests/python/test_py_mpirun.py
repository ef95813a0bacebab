"""The Python package under `mpirun -np 2` (docs/distributed.md): TrainingSession(parallel=...) with the
DistributedSampler trains like one process with twice the batch, only rank 0 writes, the checkpoint resumes in
one process; the scikit-learn estimators refuse to run on several ranks with a clear error."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import onnxtrain as ot

from conftest import ROOT

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun on PATH (install openmpi-bin)")
EXAMPLE = ROOT / "examples" / "python" / "train_mpi.py"


def mpirun(np_, args, env, timeout=240):
    """OpenMPI refuses root without the two variables and needs --oversubscribe for more ranks than cores."""
    env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    cmd = [MPIRUN, "-np", str(np_), "--oversubscribe", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpi") / "mlp.onnx"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_mlp.py"), str(path), "--sizes", "16", "32", "8", "1"],
                   check=True, capture_output=True)
    return path


def relative(a, b):
    """(per tensor: max|a-b| / max|b|, element-wise: max |a-b| / max(|b|, 1e-3)), as the C++ mpirun tests."""
    return (float(np.abs(a - b).max() / np.abs(b).max()),
            float((np.abs(a - b) / np.maximum(np.abs(b), 1e-3)).max()))


def test_two_ranks_train_like_one_process_with_twice_the_batch(mlp, tmp_path, python_env):
    one = subprocess.run([sys.executable, str(EXAMPLE), str(mlp), "--out", str(tmp_path / "one"), "--batch", "16",
                          "--dump-weights"], env=python_env, capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr
    assert "1 rank(s) (single)" in one.stdout
    two = mpirun(2, [str(EXAMPLE), str(mlp), "--out", str(tmp_path / "two"), "--batch", "8", "--dump-weights"], python_env)
    assert two.returncode == 0, two.stdout + two.stderr
    assert two.stdout.count("2 rank(s) (mpi), 8 rows per rank per step") == 1, two.stdout  # rank 0 prints

    w1 = dict(np.load(tmp_path / "one" / "weights_rank0.npz"))
    r0 = dict(np.load(tmp_path / "two" / "weights_rank0.npz"))
    r1 = dict(np.load(tmp_path / "two" / "weights_rank1.npz"))
    start = ot.TrainingSession(str(mlp)).weights()
    for name in w1:
        assert np.array_equal(r0[name], r1[name]), f"{name}: the ranks' weights must be identical"
        assert not np.allclose(w1[name], start[name]), f"{name}: training must move it"
        per_tensor, element = relative(r0[name], w1[name])
        assert per_tensor <= 1e-5, (name, per_tensor)
        assert element <= 1e-4, (name, element)
    # The reported loss is that of both ranks' batches: the single process's, line for line.
    losses = lambda out: [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    np.testing.assert_allclose(losses(two.stdout), losses(one.stdout), rtol=1e-5)
    assert len(losses(two.stdout)) == 4

    # Rank 0 wrote the checkpoint; it resumes in one process with exactly the ranks' weights and step.
    resumed = ot.TrainingSession.from_checkpoint(str(tmp_path / "two" / "checkpoint.onnx"))
    assert resumed.step == 20
    assert resumed.world_size == 1 and resumed.communicator is None
    for name, w in resumed.weights().items():
        assert np.array_equal(w, r0[name]), name


def test_parallel_outside_mpirun_is_a_single_process(mlp):
    s = ot.TrainingSession(str(mlp), parallel=True)
    assert (s.rank, s.world_size, s.communicator.backend) == (0, 1, "single")
    assert ot.launched_by_mpi() is False
    with pytest.raises(TypeError, match="parallel: expected None, True/False or an onnxtrain.Communicator"):
        ot.TrainingSession(str(mlp), parallel="mpi")
    # The sampler is the C++ one: docs/distributed.md's reference value.
    assert ot.DistributedSampler(10, shuffle=True, seed=0).indices().tolist() == [0, 1, 4, 6, 3, 9, 8, 7, 2, 5]
    shards = [ot.DistributedSampler(10, r, 2, seed=0).indices().tolist() for r in (0, 1)]
    assert shards == [[0, 4, 3, 8, 2], [1, 6, 9, 7, 5]]


def test_sklearn_estimators_refuse_several_ranks(python_env):
    code = ("import numpy as np\n"
            "from onnxtrain.sklearn import MLPRegressor\n"
            "x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)\n"
            "MLPRegressor(hidden_layer_sizes=(4,), max_iter=2).fit(x, x[:, 0])\n")
    r = mpirun(2, ["-c", code], python_env)
    assert r.returncode != 0
    assert "MLPRegressor.fit runs in one process, but this is one of 2 MPI ranks" in r.stderr, r.stdout + r.stderr
    # A single rank (mpirun -np 1) is one process: it fits.
    r = mpirun(1, ["-c", code], python_env)
    assert r.returncode == 0, r.stdout + r.stderr
