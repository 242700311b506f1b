"""The entrypoint of `doctor --probe`'s job: each rank says it is ready, waits for the stop signal,
and records whether it arrived. Stdlib and slurmddp only: it runs inside an ordinary rank."""

from __future__ import annotations

import socket
import time
from typing import Any

from slurmddp.job.process import signals
from slurmddp.job.train.context import RunContext
from slurmddp.rundir.probe import ProbeReady, ProbeSeen


def wait_for_stop(ctx: RunContext) -> dict[str, Any]:
    host = socket.gethostname()
    ProbeReady(ctx.rank, host, time.time()).write(ctx.run_dir)
    deadline = time.monotonic() + float(ctx.train.wait_s)
    while signals.received() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    got = signals.received()
    seen = ProbeSeen(ctx.rank, host, signals.name(got) if got is not None else None, signals.received_at())
    seen.write(ctx.run_dir)
    return seen.to_json()
