"""Ctrl-C during `submit --wait`.

A local run's controller (submitit's) and its ranks are children of this process, in the
terminal's foreground process group: a Ctrl-C reached each of them, the ranks died of it (the run
read FAILED) and the controller's KeyboardInterrupt traceback landed after the shell's prompt. So
they are started ignoring SIGINT (an ignored signal stays ignored across fork and exec, and Python
keeps it so), and a Ctrl-C stops them as `cancel` does: the run is marked cancelled, the ranks get
SIGTERM, save at their next step and stop. A Slurm job runs on whatever the terminal does; a
Ctrl-C only stops following it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import TextIO

from slurmddp.defaults import RunExecutor
from slurmddp.manage.actions import cancel
from slurmddp.manage.backend import for_executor
from slurmddp.submit.submitter import Submission


@contextlib.contextmanager
def out_of_reach(executor: RunExecutor) -> Iterator[None]:
    """Whatever starts inside (a local job's controller and ranks) ignores the terminal's Ctrl-C."""
    if not for_executor(executor).runs_here:
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def stop(sub: Submission, out: TextIO) -> bool:
    """Act on a Ctrl-C: stop a run on this machine as `cancel` does (True: follow it to its end),
    or say that a Slurm job goes on (False)."""
    run_dir = sub.plan.run_dir
    if not for_executor(sub.plan.executor).runs_here:
        out.write(
            f"slurmddp: stopped following; job {sub.job_id} keeps running. "
            f"Stop it with: python -m slurmddp cancel {run_dir}\n"
        )
        out.flush()
        return False
    cancel(str(run_dir))
    out.write("slurmddp: Ctrl-C: cancelling; the ranks save a checkpoint at their next step and stop\n")
    out.flush()
    return True
