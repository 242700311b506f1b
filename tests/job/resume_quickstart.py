"""The quickstart's training function, stopped by the USR2 that Slurm would send when rank 0 logs
step RESUME_TEST_STOP_AT of the first attempt (train.log_every=1 logs every step)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from slurmddp import RunContext

# The rank imports this file by its path; its neighbours and examples/ (not a package) by name.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "examples")]
import quickstart_train  # noqa: E402
from resume_train import STOP_AT_ENV  # noqa: E402


def train(ctx: RunContext) -> dict[str, object]:
    stop_at = int(os.environ.get(STOP_AT_ENV, "-1"))
    log = ctx.log

    def log_then_stop(step: int, **metrics: Any) -> None:
        log(step, **metrics)
        if step == stop_at and ctx.restart_count == 0:
            os.kill(os.getpid(), signal.SIGUSR2)

    ctx.log = log_then_stop  # type: ignore[method-assign]
    return quickstart_train.train(ctx)
