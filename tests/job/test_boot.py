"""The task's first code: the stop signals are caught from the start and ignored once the work is
done, so a late time-limit signal cannot kill a rank that has finished."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slurmddp.defaults import STOP_SIGNALS_ENV


def test_stop_signals_are_caught_during_the_run_and_ignored_at_exit(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(
        "import atexit, os, signal\n"
        # During the run: a stop signal is recorded, not fatal.
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "from slurmddp.job import signals\n"
        "print('recorded', signals.name(signals.received()))\n"
        # atexit runs after boot has handed back: what a signal would meet while Python shuts down.
        "atexit.register(lambda: print('ignored at exit', [signal.getsignal(s) == signal.SIG_IGN "
        "for s in (signal.SIGUSR2, signal.SIGTERM)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-u", "-m", "slurmddp.job.boot", "-m", "work"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), STOP_SIGNALS_ENV: "USR2,TERM"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["recorded SIGUSR2", "ignored at exit [True, True]"]
