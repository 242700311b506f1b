"""The command line at a real terminal (tests/terminal.py: a pty of 100 or 60 columns, Ctrl-C typed
into it), with the quickstart run locally: the live view and rank 0 number the attempt alike, the
ending block labels its two times, a Ctrl-C stops the ranks for the cancel and says where a
resubmit resumes, and `cancel` without a run asks before it cancels."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, only_run
from quickstart_runs import last_step
from terminal import CTRL_C, Terminal

from slurmddp.errors import EXIT_INTERRUPTED

pytestmark = pytest.mark.process

LOCAL = (str(QUICKSTART), "executor=local", "train.record_samples=true")


def submit(tmp_path: Path, columns: int, *settings: str) -> tuple[Terminal, Path]:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "slurmddp", "submit", *settings, f"output_dir={out}"]
    return Terminal.start(argv, str(tmp_path), os.environ, columns), out


def rank0_log(run: Path) -> str:
    return "".join(path.read_text() for path in sorted((run / "logs").glob("*_0_log.*")))


@pytest.mark.parametrize("columns", [100, 60])
def test_the_live_view_and_rank_0_number_the_attempt_alike(tmp_path: Path, columns: int) -> None:
    term, out = submit(tmp_path, columns, *LOCAL, "train.epochs=2")
    try:
        assert term.wait(300) == 0, term.text()[-3000:]
    finally:
        term.kill()
    text = "\n".join(term.screen_lines())
    assert "[rank 0] slurmddp: rank 0 of 4 (node 0, local rank 0)" in text and ", attempt 1\n" in text, text
    assert "attempt 1" in text.split("[rank 0] epoch 0 step")[1], "the live view names no attempt"
    assert "attempt 2" not in text and "attempt 0" not in text, text
    assert "in 1 attempt (status's elapsed)" in text and "from submission to the end" in text, text
    assert only_run(out).is_dir()


def test_ctrl_c_cancels_saves_and_says_where_a_resubmit_resumes(tmp_path: Path) -> None:
    term, out = submit(tmp_path, 100, *LOCAL, "train.epochs=60", "checkpoint.every_steps=1000")
    try:
        assert term.read_until(lambda _: last_step(out) >= 10, 240), term.text()[-3000:]
        term.type(CTRL_C)
        assert term.wait(120) == EXIT_INTERRUPTED, term.text()[-3000:]
    finally:
        term.kill()
    run = only_run(out)
    stopped_at = int(sorted((run / "checkpoints").glob("step-*"))[-1].name.split("-")[1])
    text = "\n".join(term.screen_lines())
    assert "Ctrl-C: cancelling" in text and "Traceback" not in text, text[-3000:]
    assert f"run it again from step {stopped_at}, its newest complete checkpoint" in text, text[-3000:]
    log = rank0_log(run)
    assert f"stopped at step {stopped_at} for the cancel and saved a checkpoint there" in log, log[-2000:]
    assert "will be requeued" not in log and "already ended" not in log, log[-2000:]


def test_cancel_without_a_run_asks_at_a_terminal_then_stops_the_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    settings = [*LOCAL, "resources.nodes=1", "train.epochs=60", f"output_dir={out}"]
    run_proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", *settings],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    term = None
    try:
        deadline = time.monotonic() + 240
        while last_step(out) < 5:
            assert run_proc.poll() is None and time.monotonic() < deadline, "no step 5"
            time.sleep(0.05)
        run = only_run(out)
        term = Terminal.start([sys.executable, "-m", "slurmddp", "cancel"], str(tmp_path), os.environ, 100)
        assert term.read_until(lambda t: "[y/N]" in t.text(), 60), term.text()
        assert f"cancel the newest submission, {run}" in term.text()
        term.type(b"y\n")
        assert term.wait(60) == 0, term.text()
        run_proc.wait(120)
    finally:
        if term is not None:
            term.kill()
        run_proc.kill()
    assert "for the cancel and saved a checkpoint there" in rank0_log(run)
