"""Secure defaults (issue 15): what a run listens on, what it reads back, where it may write.

* A real ``dpmm run`` process: every socket it and its children (the LocalCluster's scheduler,
  nanny and worker, their dashboards, Prefect's temporary server) listen on during the run is
  on 127.0.0.1, never on all interfaces; and with column names and group ids that look like
  paths it writes nothing outside OUT, its dataset store and Prefect's home.
* Nothing read back from disk is unpickled: a scan of the package's code for every way to
  unpickle, and a model directory with a pickle planted in it is refused before the pickle runs.
* Generated names cannot leave OUT; OUT is never INPUT, inside it, or around it (nor around a
  model or the dataset stores): one line, exit status 2, nothing started or written.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from flows.cli import main
from pipeline.core import outputs
from pipeline.core.errors import InputError
from pipeline.core.paths import check_separate, child, safe_name
from tests import prefect_db

pytestmark = pytest.mark.usefixtures("prefect_harness")


ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1"}


def dpmm_command() -> list[str]:
    exe = Path(sys.executable).with_name("dpmm")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "flows.cli"]


def listening(root: psutil.Process) -> list[tuple[int, str, str, int]]:
    """(pid, command line, address, port) of every listening TCP socket of ``root`` and of
    its descendants."""
    found = []
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.append((p.pid, cmd, c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_the_socket_watch_sees_a_wide_listener():
    """Not vacuous: a child listening on all interfaces is reported as such."""
    code = (
        "import socket, sys, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        found = listening(psutil.Process())  # this process and its children
        assert (child.pid, "0.0.0.0", port) in {(pid, ip, p) for pid, _, ip, p in found}
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_real_run_listens_on_loopback_only_and_writes_only_under_out(tmp_path: Path):
    rng = np.random.default_rng(0)
    n = 600
    y = rng.integers(0, 3, size=n)
    X = 12.0 * np.eye(3)[y] + rng.normal(size=(n, 3))
    # column names and group ids that would be paths if anything made file names of them
    df = pd.DataFrame(X, columns=["../../escaped", "/tmp/absolute", "c/../../d"])
    df["../group"] = [f"../../g{i % 40}" for i in range(n)]
    inp = tmp_path / "in.csv"
    df.to_csv(inp, index=False)
    out = tmp_path / "work" / "out"
    env = {
        **os.environ,
        "PREFECT_HOME": prefect_db.new_home(tmp_path / "prefect"),
        "DPMM_DATA_DIR": str(tmp_path / "datasets"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    }
    before = files_under(tmp_path)
    cmd = [
        *dpmm_command(),
        "run",
        str(inp),
        "--out",
        str(out),
        "--group-column",
        "../group",
        "--chunk-rows",
        "200",
        "--workers",
        "1",
        "--no-report",
        "--quiet",
    ]
    (tmp_path / "work").mkdir()
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path / "work",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[tuple[int, str, int], str] = {}
    deadline = time.monotonic() + 800
    try:
        root = psutil.Process(proc.pid)
        while proc.poll() is None and time.monotonic() < deadline:
            for pid, cmdline, ip, port in listening(root):
                seen[(pid, ip, port)] = cmdline
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    wide = {k: v for k, v in seen.items() if k[1] not in LOOPBACK}
    assert not wide, f"listening beyond this machine: {wide}"
    # not vacuous: the scheduler and its dashboard (the dpmm process), the worker (its own
    # process) and Prefect's temporary API server (uvicorn) were all seen listening
    pids = {pid for pid, _, _ in seen}
    assert proc.pid in pids and len(pids) >= 3, seen
    assert any("uvicorn" in c and "prefect" in c for c in seen.values()), seen
    assert any("8787" == str(port) for _, _, port in seen) or len(seen) >= 4, seen
    # everything the run wrote is under OUT, the dataset stores or Prefect's home
    allowed = (out, tmp_path / "datasets", tmp_path / "prefect")
    stray = [
        p for p in files_under(tmp_path) - before if not any(p.is_relative_to(a) for a in allowed)
    ]
    assert not stray, stray
    assert not list(tmp_path.rglob("escaped")) and not list(tmp_path.rglob("g1"))
    assert (out / "run.json").exists()


# -- nothing is unpickled ----------------------------------------------------------------------
UNPICKLERS = {"pickle", "cloudpickle", "dill", "joblib", "marshal", "shelve", "_pickle", "torch"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def unpickling_calls(source: str, filename: str = "<string>") -> list[str]:
    """Every call in ``source`` that can unpickle: ``pickle.load(s)`` and its relatives
    (cloudpickle, dill, joblib, marshal, shelve, torch), ``Unpickler``, ``read_pickle``, and
    ``np.load`` / ``numpy.load`` / ``*.load`` of numpy without ``allow_pickle=False``."""
    found = []
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        head, _, rest = name.partition(".")
        full = f"{aliases.get(head, head)}.{rest}" if rest else aliases.get(head, head)
        base, _, attr = full.rpartition(".")
        where = f"{filename}:{node.lineno}: {name}"
        if base.split(".")[0] in UNPICKLERS and attr in ("load", "loads", "open", "Unpickler"):
            found.append(where)
        elif attr in ("read_pickle", "Unpickler") or full in ("pickle.load", "pickle.loads"):
            found.append(where)
        elif full in ("numpy.load", "np.load", "numpy.lib.npyio.load"):
            safe = any(
                k.arg == "allow_pickle"
                and isinstance(k.value, ast.Constant)
                and k.value.value is False
                for k in node.keywords
            )
            if not safe:
                found.append(where)
    return found


def test_the_scanner_finds_every_way_to_unpickle():
    planted = """
import pickle, joblib
import numpy as np
import numpy
import pandas as pd
from cloudpickle import loads as cl
from pickle import Unpickler
pickle.loads(b"")
joblib.load("m.joblib")
np.load("a.npy")
numpy.load("a.npy", allow_pickle=True)
pd.read_pickle("f.pkl")
cl(b"")
Unpickler(f).load()
np.load("ok.npy", allow_pickle=False)
"""
    found = unpickling_calls(planted)
    assert len(found) == 7, found
    assert not any(":15:" in f for f in found)


def test_no_code_unpickles_anything():
    found = []
    for pkg in ("pipeline", "flows", "kernels"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            found += unpickling_calls(f.read_text(), str(f.relative_to(ROOT)))
    assert not found, found


class _Planted:
    """Unpickling it creates the file ``marker``: proof that a pickle ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def saved_model(tmp_path: Path) -> Path:
    from pipeline.estimators.mapdp import MAPDP
    from pipeline.estimators.model import save_model

    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(-5, 1, (60, 2)), rng.normal(5, 1, (60, 2))])
    est = MAPDP(random_state=0, n_restarts=1).fit(X)
    return save_model(est, tmp_path / "model")


def _plant_object_array(model: Path, marker: Path) -> None:
    """Replace model.npz by one holding a pickled object array, with model.json's checksum
    updated to match, as an attacker who can write the directory would."""
    arr = np.empty(1, dtype=object)
    arr[0] = _Planted(marker)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z, z.open("a0.npy", "w") as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=True)
    data = buf.getvalue()
    (model / "model.npz").write_bytes(data)
    doc = json.loads((model / "model.json").read_text())
    doc["arrays"]["sha256"] = hashlib.sha256(data).hexdigest()
    (model / "model.json").write_text(json.dumps(doc))


def test_a_model_with_a_planted_pickle_is_refused(saved_model: Path, tmp_path: Path):
    from pipeline.core.persist import PersistError
    from pipeline.estimators.model import load_model

    marker = tmp_path / "unpickled"
    # the planted payload works: pickle would run it
    pickle.loads(pickle.dumps(_Planted(marker)))
    assert marker.exists()
    marker.unlink()

    _plant_object_array(saved_model, marker)
    with pytest.raises(PersistError, match=r"model\.npz"):
        load_model(saved_model)
    assert not marker.exists()

    # a directory of pickles only (what joblib.dump would leave) is not a model
    bare = tmp_path / "pickled"
    bare.mkdir()
    (bare / "model.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(PersistError):
        load_model(bare)
    assert not marker.exists()


def test_dpmm_score_refuses_a_planted_pickle(saved_model: Path, tmp_path: Path, capsys):
    marker = tmp_path / "unpickled"
    _plant_object_array(saved_model, marker)
    inp = tmp_path / "new.csv"
    pd.DataFrame({"x0": [0.0, 1.0], "x1": [0.0, 1.0]}).to_csv(inp, index=False)
    code = main(["score", str(saved_model), str(inp), "--out", str(tmp_path / "scores")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "model.npz" in err and "refused" in err, err
    assert not marker.exists() and not (tmp_path / "scores").exists()


# -- paths -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["..", ".", "", "../x", "a/b", "/etc/passwd", "a\\b", "x\x00y", "../../g1"]
)
def test_generated_names_are_one_plain_component(name: str, tmp_path: Path):
    with pytest.raises(ValueError, match="file name"):
        child(tmp_path, name)
    with pytest.raises(ValueError):
        outputs.write_outputs(tmp_path / "out", json_files={name: {"a": 1}})
    assert not any(tmp_path.parent.rglob("passwd.json")) and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("name", ["labels.parquet", "date=2024-01-02", "cv-3.zarr", "..a", "a.."])
def test_plain_names_pass(name: str, tmp_path: Path):
    assert safe_name(name) == name and child(tmp_path, name) == tmp_path / name


def test_check_separate_paths_and_urls(tmp_path: Path):
    (tmp_path / "in").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "in")
    bad = [
        (tmp_path / "in", tmp_path / "in", "is the same as"),
        (tmp_path / "in" / "out", tmp_path / "in", "is inside"),
        (tmp_path / "link" / "out", tmp_path / "in", "is inside"),  # through a symlink
        (tmp_path / "in" / ".." / "in" / "o", tmp_path / "in", "is inside"),
        (tmp_path, tmp_path / "in", "contains"),
        ("s3://b/runs/out", "s3://b/runs", "is inside"),
        ("s3://b/runs/", "s3://b//runs", "is the same as"),
        ("s3://b", "s3://b/in.parquet", "contains"),
        (f"file://{tmp_path}/in/o", tmp_path / "in", "is inside"),
    ]
    for out, inp, problem in bad:
        with pytest.raises(InputError, match=problem):
            check_separate([("--out", out)], [("INPUT", inp)])
    fine = [
        (tmp_path / "input", tmp_path / "in"),  # a common prefix is not containment
        ("s3://b/runs2", "s3://b/runs"),
        ("s3://other/runs", "s3://b/runs"),
        ("gs://b/runs", "s3://b/runs"),
        (tmp_path / "in", "s3://b" + str(tmp_path / "in")),
    ]
    for out, inp in fine:
        check_separate([("--out", out)], [("INPUT", inp)])
    with pytest.raises(InputError, match=r"'\.\.' in a URL"):
        check_separate([("--out", "s3://b/a/../x")], [("INPUT", "s3://b/in")])


def _one_line_exit_2(argv: list[str], capsys) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("dpmm: error: "), err
    return err


def test_cli_refuses_out_overlapping_its_inputs(tmp_path: Path, capsys, saved_model: Path):
    data = tmp_path / "data"
    data.mkdir()
    inp = data / "in.csv"
    pd.DataFrame({"a": [0.0, 1.0, 2.0], "b": [1.0, 0.0, 2.0]}).to_csv(inp, index=False)
    pq = tmp_path / "parts"
    pq.mkdir()
    pd.DataFrame({"a": [0.0, 1.0]}).to_parquet(pq / "p0.parquet")
    stores = tmp_path / "stores"
    snapshot = files_under(tmp_path)
    cases = [
        (["run", inp, "--out", inp], "is the same as INPUT"),
        (["run", inp, "--out", inp / "out"], "is inside INPUT"),
        (["run", pq, "--out", pq], "is the same as INPUT"),
        (["run", pq, "--out", pq / "out"], "is inside INPUT"),
        (["run", inp, "--out", tmp_path], "contains INPUT"),
        (["run", inp, "--out", stores / "o", "--data-dir", stores], "is inside --data-dir"),
        (["run", inp, "--out", tmp_path / "o", "--data-dir", tmp_path / "o" / "s"], "contains"),
        (["cv", inp, "--out", data], "contains INPUT"),
        (["hmm", inp, "--out", data, "--sequence-column", "a", "--time-column", "b"], "INPUT"),
        (["score", saved_model, inp, "--out", saved_model / "scores"], "is inside MODEL"),
        (["update", saved_model, inp, "--out", saved_model], "is the same as MODEL"),
        (["run", inp, "--out", saved_model / "o", "--warm-start", saved_model], "--warm-start"),
        (["run", "s3://bucket/in.csv", "--out", "s3://bucket/in.csv/o"], "is inside INPUT"),
        (["serve", data, "--models", data / "models"], "--models"),
    ]
    for argv, expected in cases:
        err = _one_line_exit_2(argv, capsys)
        assert expected in err, (argv, err)
    assert files_under(tmp_path) == snapshot  # nothing was written anywhere
