"""The GPU engines (``pipeline.engines.gpu``) on machines without a GPU: ``--device gpu``
refuses in one line naming what is missing, and everything else runs under numba's CUDA
simulator in a process of its own (``gpu_sim.py``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from pipeline.engines import get_engine
from pipeline.engines.gpu import DeviceError, missing_device

ROOT = Path(__file__).resolve().parents[3]
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


@pytest.fixture
def no_numba_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if numba-cuda were not installed (``find_spec`` answers None for a
    module that ``sys.modules`` maps to None)."""
    monkeypatch.setitem(sys.modules, "numba_cuda", None)


def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "x.csv"
    rng = np.random.default_rng(0)
    np.savetxt(path, rng.normal(size=(20, 2)), delimiter=",", header="a,b", comments="")
    return path


def run_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = ["run", str(csv_file(tmp_path)), "--out", str(tmp_path / "out"), "--device", "gpu"]
    code = main(args)
    err = capsys.readouterr().err.strip()
    return code, err


def test_without_numba_cuda_device_gpu_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_numba_cuda: None
) -> None:
    code, err = run_gpu(tmp_path, capsys)
    assert code == 2
    assert err.count("\n") == 0
    assert "--device gpu: numba-cuda is not installed" in err
    assert "pip install -e '.[gpu]'" in err
    assert not (tmp_path / "out").exists()


def test_without_numba_cuda_the_library_refuses(no_numba_cuda: None) -> None:
    from pipeline.distributed.fit import fit_distributed
    from pipeline.estimators.mapdp import MAPDP

    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(DeviceError, match="numba-cuda is not installed"):
        fit_distributed(X, device="gpu")
    with pytest.raises(DeviceError, match="numba-cuda is not installed"):
        MAPDP(device="gpu").fit(X)


@pytest.mark.skipif(not HAS_NUMBA_CUDA, reason="numba-cuda is not installed")
def test_without_a_gpu_device_gpu_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if missing_device() is None:
        pytest.skip("this machine has a GPU")
    code, err = run_gpu(tmp_path, capsys)
    assert code == 2
    assert err.count("\n") == 0
    assert "--device gpu: no CUDA GPU found" in err


def test_the_gpu_engines_are_found_by_name_and_device() -> None:
    assert get_engine("mapdp", "gpu").name == "mapdp-gpu"
    assert get_engine("kmeans", "gpu") is get_engine("kmeans-gpu")
    assert get_engine("mapdp", "cpu").name == "mapdp"
    from pipeline.core.config import FitParams

    with pytest.raises(ValueError, match="device='gpu'"):
        FitParams(engine="asugs", device="gpu").checked()
    with pytest.raises(ValueError, match="device must be one of"):
        FitParams(device="tpu").checked()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NUMBA_CUDA, reason="numba-cuda is not installed")
def test_under_the_cuda_simulator() -> None:
    """The kernels against NumPy and the engine contract, in a process with
    ``NUMBA_ENABLE_CUDASIM=1`` (``gpu_sim.py``)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    cmd.append(str(Path(__file__).with_name("gpu_sim.py")))
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout, res.stdout[-2000:]


def test_the_objective_guard_sees_a_step_that_raises_eq_3_3() -> None:
    """``GpuPass._rises``: a chunk's change that moves a record of one blob into the other
    raises eq. 3.3 (the chunk is then redone sequentially); no change, or the move back, does
    not."""
    from pipeline.engines.gpu import GpuPass
    from pipeline.engines.mixture import PassInput
    from pipeline.families import GaussianNW

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(-5.0, 1.0, (30, 2)), rng.normal(5.0, 1.0, (30, 2))])
    fam = GaussianNW.empirical_bayes(X).as_product()
    z = np.repeat([0, 1], 30)
    stats = fam.stats_of(X, z, 2)
    none = np.zeros(0, dtype=np.int64)
    msg = PassInput(2, stats, 1.0, np.arange(2), 2, none, fam, 0, 0, none, none, -1)
    one = fam.stats_of(X[:1], np.zeros(1, dtype=np.int64), 1)[0]
    wrong = np.vstack([-one, one])  # record 0 from blob 0's cluster to blob 1's
    empty = np.zeros((0, stats.shape[1]))
    assert GpuPass._rises(msg, wrong, empty)
    assert not GpuPass._rises(msg, np.zeros_like(stats), empty)
    bad = replace_stats(msg, stats + wrong)
    assert not GpuPass._rises(bad, -wrong, empty)


def replace_stats(msg, stats):
    from dataclasses import replace

    return replace(msg, stats=stats)


@pytest.mark.skipif(not HAS_NUMBA_CUDA, reason="numba-cuda is not installed")
def test_numba_cuda_imports_where_numpy_has_no_row_stack() -> None:
    """numpy 2.5 removed ``np.row_stack``, which numba-cuda 0.30.4 overloads when it imports
    ``numba.cuda`` and again when it builds its CUDA target (``numba.cuda.np.arrayobj``):
    ``kernels.cuda_device.import_cuda`` makes both work, in a process whose numpy lacks it."""
    code = (
        "import numpy as np\n"
        "np.__dict__.pop('row_stack', None)\n"
        "from kernels.cuda_device import import_cuda\n"
        "import_cuda()\n"
        "from numba.cuda.np import arrayobj\n"
        "import kernels.cuda_mapdp\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
