"""Run directories are created first, with the permissions output_mode gives (nobody else may write
them: the ranks unpickle their job from there), and one that cannot be created is refused with the
OS's reason and the fix, leaving nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_sources import write_main

from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Entrypoint, Experiment
from slurmddp.files import make_dirs, no_group_write
from slurmddp.submit.submitter import discard, make_run_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def experiment(output_dir: Path | str, output_mode: str = "private") -> Experiment:
    return Experiment(
        output_dir=str(output_dir),
        output_mode=output_mode,  # type: ignore[arg-type]
        entrypoint=Entrypoint(function="train.py:main"),
    )


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("output_mode", "expected"), [("private", 0o700), ("group", 0o750)])
@pytest.mark.parametrize("mask", [0o002, 0o077])
def test_every_directory_created_has_the_mode_output_mode_gives(
    tmp_path: Path, output_mode: str, expected: int, mask: int
) -> None:
    out = tmp_path / "out"
    run = out / "exp" / "20260101-000000-abcd"
    with umask(mask):
        created = make_run_dir(run, experiment(out, output_mode), run / "logs")
    assert created == [out, out / "exp", run, run / "logs"]
    assert {str(p.relative_to(tmp_path)): mode(p) for p in created} == {
        str(p.relative_to(tmp_path)): expected for p in created
    }


def test_parents_that_exist_keep_their_permissions(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    out.mkdir(mode=0o775)
    out.chmod(0o775)
    created = make_run_dir(out / "exp" / "run", experiment(out))
    assert created == [out / "exp", out / "exp" / "run"]
    assert mode(out) == 0o775


def test_an_existing_run_directory_is_not_reused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match="File exists"):
        make_run_dir(tmp_path / "run", experiment(tmp_path))


def test_discard_removes_the_run_and_the_parents_it_created(tmp_path: Path) -> None:
    run = tmp_path / "out" / "exp" / "run"
    created = make_run_dir(run, experiment(tmp_path / "out"), run / "logs")
    (run / "logs" / "x").write_text("x")
    discard(run, created)
    assert list(tmp_path.iterdir()) == []


def test_a_parent_another_submission_filled_meanwhile_stays(tmp_path: Path) -> None:
    run = tmp_path / "out" / "exp" / "run"
    created = make_run_dir(run, experiment(tmp_path / "out"))
    (tmp_path / "out" / "exp" / "other-run").mkdir()
    discard(run, created)
    assert [p.name for p in (tmp_path / "out" / "exp").iterdir()] == ["other-run"]


def immutable(path: Path) -> bool:
    """Make `path` immutable (what stops root from creating in it); False where chattr cannot."""
    try:
        proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    except FileNotFoundError:
        return False
    return proc.returncode == 0


@pytest.mark.parametrize("case", ["under a file", "name too long", "immutable"])
def test_a_run_directory_that_cannot_be_created_is_a_config_error(tmp_path: Path, case: str) -> None:
    blocked = tmp_path / "blocked"
    if case == "under a file":
        blocked.write_text("a file")
        out, reason = blocked / "runs", "Not a directory"
    elif case == "name too long":
        out, reason = tmp_path / ("x" * 300), "File name too long"
    else:
        blocked.mkdir()
        if not immutable(blocked):
            pytest.skip("chattr +i does not work here")
        out, reason = blocked / "runs", "Operation not permitted"
    run = out / "exp" / "20260101-000000-abcd"
    try:
        with pytest.raises(ConfigError) as caught:
            make_run_dir(run, experiment(out), run / "logs")
    finally:
        if case == "immutable":
            subprocess.run(["chattr", "-i", str(blocked)], check=True)
    message = str(caught.value)
    assert message.startswith(f"output_dir: cannot create the run directory {run} (output_dir='{out}'): ")
    assert reason in message and "nothing was submitted" in message
    assert "Set output_dir" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == (["blocked"] if case != "name too long" else [])
    if blocked.is_dir():
        assert list(blocked.iterdir()) == []


def test_make_dirs_undoes_a_half_made_path(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(OSError, match="File name too long"):
        make_dirs(tmp_path / "a" / "b" / ("c" * 300) / "d", 0o700)
    assert list((tmp_path / "a").iterdir()) == []


def test_files_created_under_no_group_write_are_not_group_writable(tmp_path: Path) -> None:
    with umask(0o002):
        with no_group_write():
            (tmp_path / "pkl").write_text("")
        (tmp_path / "after").write_text("")
        assert os.umask(0o002) == 0o002  # restored
    assert mode(tmp_path / "pkl") == 0o644
    assert mode(tmp_path / "after") == 0o664


def test_a_local_run_is_private_and_its_ranks_accept_its_pickle(tmp_path: Path) -> None:
    write_main(tmp_path, returns="{'rank': ctx.rank}")
    (tmp_path / "exp.yaml").write_text(
        "entrypoint: train.py:main\nresources: {nodes: 1, tasks_per_node: 1}\n"
        "preflight: {enabled: false}\ntrackers: {tensorboard: false}\n"
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", "exp.yaml", "executor=local", f"output_dir={out}"],
        cwd=tmp_path,
        # A umask of 002 (user private groups) would make submitit's pickle group-writable.
        preexec_fn=lambda: os.umask(0o002),
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = out.glob("exp/*")
    assert [mode(p) for p in (out, out / "exp", run, run / "logs")] == [0o700] * 4
    (pickled,) = (run / "logs").glob("*_submitted.pkl")
    assert not mode(pickled) & 0o022
    assert json.loads((run / "result.json").read_text())["ranks"] == [{"rank": 0}]
