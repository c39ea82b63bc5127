"""Every command under faults (``tests.campaign``): ``dpmm cv``, ``longitudinal``, ``hmm``,
``score``, ``serve --once`` and the tree stage (``run --summaries``), each a process of its own on
a Dask cluster of separate processes, with one worker SIGKILLed in the middle of its run, every
worker at once, or the whole command SIGKILLed and run again: each finishes with the undisturbed
run's result (labels, the chosen cell, the model) and leaves nothing behind. Two ``dpmm score``
writing one OUT at once each stage their own copy: one output, whole, and nothing else."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import campaign as faults

# the moment of each fault, as a share of the command's undisturbed duration: in the middle of
# its work, past the start of Python, Prefect and the cluster's client (the campaign draws it)
MOMENT = {
    "kill-worker": 0.6,
    "kill-workers": 0.7,
    "kill-command": 0.6,
    "full-disk": 0.5,
    "damage-chunk": 0.3,
}


class Bench:
    """The workspace, the cluster and each command's undisturbed result, made once."""

    def __init__(self, root: Path, cl: faults.Cluster) -> None:
        self.root, self.cl = root, cl
        self.ws = faults.Workspace(root / "inputs")
        self.ws.root.mkdir()
        self.ws.write()
        self.refs: dict[str, faults.Reference] = {}

    def reference(self, name: str) -> faults.Reference:
        if name in ("score", "tree") and not self.ws.model.exists():
            faults.reference(faults.COMMANDS["tree"], self.ws, self.cl, self.ws.model.parent)
        if name not in self.refs:
            cmd = faults.COMMANDS[name]
            self.refs[name] = faults.reference(cmd, self.ws, self.cl, self.root / f"ref-{name}")
        return self.refs[name]


@pytest.fixture(scope="module")
def bench(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Bench]:
    root = tmp_path_factory.mktemp("faults")
    with faults.prefect_server() as url, faults.cluster(root) as cl:
        monkeypatch_module.setenv("PREFECT_API_URL", url)
        monkeypatch_module.setenv("DPMM_DATA_DIR", str(root / "datasets"))
        yield Bench(root, cl)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as m:
        yield m


def run_with(bench: Bench, name: str, fault: str, tmp_path: Path) -> faults.Outcome:
    ref = bench.reference(name)
    cmd, f = faults.COMMANDS[name], faults.FAULTS[fault]
    return faults.faulted(cmd, f, bench.ws, bench.cl, tmp_path / "out", ref, MOMENT[fault])


COMMANDS = list(faults.COMMANDS)


@pytest.mark.faults
@pytest.mark.parametrize("fault", list(MOMENT))
@pytest.mark.parametrize("name", COMMANDS)
def test_the_engine_contracts_faults(bench: Bench, name: str, fault: str, tmp_path: Path) -> None:
    """One worker killed mid-run, every worker killed at once, the command killed and run
    again: each command's result equals the undisturbed run's. The disk under OUT filled, a
    chunk of the dataset store damaged: the command's result equals the undisturbed run's, or
    it stops with one line and, once the disk is freed or the store removed, its rerun's
    does."""
    o = run_with(bench, name, fault, tmp_path)
    if o.kind == "error" and faults.FAULTS[fault].repair is not None:
        assert o.reason.endswith("then, repaired: equal"), o.reason
    else:
        assert (o.kind, o.reason) == ("equal", "")
    assert o.delivered


@pytest.mark.faults
def test_two_scores_of_one_out_at_once(bench: Bench, tmp_path: Path) -> None:
    """The first to publish renames its copy into place, the second finds OUT there (one line,
    exit 2) and OUT is one whole output, the undisturbed one: no writer removed the other's
    staged copy."""
    want, duration, _ = bench.reference("score")
    cmd = faults.COMMANDS["score"]
    out = tmp_path / "out"
    runs = [faults.start(cmd, bench.ws, out, bench.cl) for _ in range(2)]
    ends = [faults.finish(r, 5 * duration + 120) for r in runs]
    assert sorted(rc for rc, _ in ends) == [0, 2], ends
    err = next(e for rc, e in ends if rc == 2).strip()
    assert "\n" not in err and err.endswith("already exists (pass --overwrite to replace it)")
    assert cmd.digest(out) == want
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    # with --overwrite both publish, one after the other, each whole
    argv = [str(faults.BIN / "dpmm"), *cmd.argv(bench.ws, out), "--scheduler"]
    argv += [bench.cl.address, "--quiet", "--overwrite"]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=5 * duration + 120)
        assert p.returncode == 0, err.decode()
    assert cmd.digest(out) == want
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
