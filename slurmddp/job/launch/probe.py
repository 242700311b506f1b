"""The entrypoint of `doctor --probe`'s job: each rank says it is ready, waits for the stop signal,
and records whether it arrived. Stdlib and slurmddp only: it runs inside an ordinary rank."""

from __future__ import annotations

import socket
import time
from typing import Any

from slurmddp.files import write_json
from slurmddp.job.process import signals
from slurmddp.job.train.context import RunContext
from slurmddp.rundir.layout import PROBE


def wait_for_stop(ctx: RunContext) -> dict[str, Any]:
    folder = ctx.run_dir / PROBE
    host = socket.gethostname()
    write_json(folder / f"ready-{ctx.rank}.json", {"rank": ctx.rank, "host": host, "time": time.time()})
    deadline = time.monotonic() + float(ctx.train.wait_s)
    while signals.received() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    got = signals.received()
    seen = {
        "rank": ctx.rank,
        "host": host,
        "signal": signals.name(got) if got is not None else None,
        "received_at": signals.received_at(),
    }
    write_json(folder / f"rank-{ctx.rank}.json", seen)
    return seen
