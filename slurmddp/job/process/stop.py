"""The stop every rank of a script agrees on: `slurmddp.should_stop()` and `exit_for_requeue()`.

A training script (a plain loop, or a framework's through its integration) asks `should_stop()` at
every step boundary, on every rank. Once a stop was asked (preemption, the time limit, `slurmddp
interrupt`), every rank answers True at the same boundary, and only there: the ranks save the same
step and end together, with no collective run inside a signal handler and none added to the
step.

How the ranks agree. The stop signal reaches every process of the step (Slurm signals them all,
the rank's own process passes SIGTERM on at once); the handler only records it (job/process/signals.py).
At its next boundary, a rank that holds the signal proposes "stop at the next reading boundary
after this one" in the rendezvous store its rank 0 process hosts (job/script/scriptrank.py); the
first proposal wins (compare-and-set). Every rank reads the key at each reading boundary, one
round trip to that store, and stops when its count reaches the agreed one. That is the same
boundary on every rank because data-parallel ranks move in lockstep: a rank cannot finish step s+1
before every rank joined step s+1's gradient all-reduce, so when the proposer writes at boundary s,
no rank has passed boundary s+1 yet, and each reads the key at the agreed boundary (> s) before
it passes it. Counting boundaries (calls), not the script's own step numbers, keeps the answer
independent of how a framework numbers its steps.

Which boundaries read. The first WARMUP + 1 all do. A round trip costs 10-25 us on an idle
loopback, but 0.1-0.6 ms where the ranks keep every core busy (3 CPU ranks on 2 cores: the
store's thread waits for one), which was 10% of a 4 ms step (docs/benchmarks.md, "Frameworks").
So every rank times its round trips and its steps over the first WARMUP boundaries and offers
K, the fewest boundaries between reads that keep its reads under STEP_SHARE of its step time (1
where steps are long, as on a GPU). The largest offer wins: the ranks far from the store have the
slowest round trips, and every rank waits for the slowest at the next all-reduce. Every rank reads
it at boundary WARMUP + 1 and from there reads every K boundaries. A stop then waits at most K
steps, which is at most about 1 / STEP_SHARE round trips.

Outside a slurmddp job (plain `python` or torchrun), `should_stop()` is always False and costs
nothing. Stdlib only at import: `import slurmddp` on a login node stays light.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from slurmddp.job.process import signals

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

STORE_ENV = "SLURMDDP_STOP_STORE"
"""`HOST:PORT` of the job's rendezvous store, set by the rank for its script; absent: no job."""
READ_EVERY_ENV = "SLURMDDP_STOP_READ_EVERY"
"""K, where the ranks' environment sets it (1: every step reads, a stop comes at the next one);
unset: chosen."""
KEY = "slurmddp/stop-at"
_NONE = "-"
"""What a read-only compare-and-set expects: never a boundary, so it never writes."""


_asked: int | None = None
"""A stop asked inside this process (the search's pruner, through `slurmddp.report`), as the
signal it stands for."""


def ask() -> None:
    """Ask for the stop every rank agrees on from inside this process, as a stop signal would:
    `should_stop()` then says True on every rank at the same step."""
    global _asked
    _asked = signal.SIGTERM


def _heard() -> int | None:
    return signals.received() or _asked


class StopForRequeue(BaseException):
    """Raised once every rank saved after a stop signal: by `ctx.loop`, or by
    `slurmddp.exit_for_requeue()` in a script. The job runs again and resumes from that save.

    A BaseException, so that a user's `except Exception` around the step cannot swallow it.
    """

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"stopped at step {step} on {signals.name(signum)}; the job will be requeued")
        self.step = step
        self.signum = signum


WARMUP = 16
"""Boundaries at which every rank reads the key while it times the reads and the steps."""
EVERY_KEY = "slurmddp/stop-read-every"
"""The largest K offered at boundary WARMUP, read by every rank at WARMUP + 1."""
STEP_SHARE = 0.0025
"""The reads' share of the step time that K keeps under: a quarter of the 1% a script's
integration may cost, as a whole step pays about three times the reads' own time where the ranks
oversubscribe the cores (the store's thread waits for one; benchmarks/stop_overhead.py: 1.016 a step
with the reads timed at 0.56%)."""
MAX_EVERY = 64
OTHER_NODE_RTT_S = 100e-6
"""What a round trip from another node costs at least: the ranks beside the store time theirs
over loopback."""


def reads_every(round_trip_s: float, step_s: float) -> int:
    """K: the fewest boundaries between reads that keep a round trip of `round_trip_s` (never
    counted under OTHER_NODE_RTT_S) under STEP_SHARE of steps of `step_s`."""
    if step_s <= 0:
        return MAX_EVERY
    every = math.ceil(max(round_trip_s, OTHER_NODE_RTT_S) / (STEP_SHARE * step_s))
    return min(MAX_EVERY, max(1, every))


class Agreement:
    """One rank's side of the agreement, over the job's store. `every`: the K this rank offers
    (READ_EVERY_ENV, tests); by default it is chosen from what the rank timed. The ranks agree on
    K as on the stop, by the lockstep: every rank offers at boundary WARMUP, before any reads."""

    def __init__(
        self,
        store: Store,
        heard: Callable[[], int | None] = _heard,
        every: int | None = None,
    ) -> None:
        self.store = store
        self.heard = heard
        """Which stop signal this process got (or the stop asked inside it), if any."""
        self.boundaries = 0
        self.agreed: int | None = None
        self.every: int | None = None
        """K, once read at boundary WARMUP + 1."""
        self._fixed = every
        self._calls: list[float] = []
        self._round_trips: list[float] = []

    def should_stop(self) -> bool:
        self.boundaries += 1
        if self.agreed is not None:
            return self.boundaries >= self.agreed
        boundary = self.boundaries
        if boundary <= WARMUP:
            self._calls.append(time.perf_counter())
        if boundary == WARMUP + 1:
            self.every = int(self.store.get(EVERY_KEY))
        if self.heard() is not None:
            value = self.store.compare_set(KEY, "", str(self._next_read(boundary + 1)))
        elif self._reads(boundary):
            started = time.perf_counter()
            value = self.store.compare_set(KEY, _NONE, _NONE)
            if boundary <= WARMUP:
                self._round_trips.append(time.perf_counter() - started)
        else:
            return False
        if boundary == WARMUP:
            # Before any rank's boundary WARMUP + 1, where each reads it: the lockstep again.
            self._offer(self._choose())
        if value.decode() != _NONE:
            self._agree(int(value))
        return self.agreed is not None and self.boundaries >= self.agreed

    def _reads(self, boundary: int) -> bool:
        """Whether every rank reads the key at `boundary`."""
        if self.every is None or boundary <= WARMUP + 1:
            return True
        return (boundary - WARMUP - 1) % self.every == 0

    def _next_read(self, boundary: int) -> int:
        """The first reading boundary from `boundary` on."""
        while not self._reads(boundary):
            boundary += 1
        return boundary

    def _offer(self, every: int) -> None:
        """Make EVERY_KEY at least `every` (a compare-and-set until the store holds as much)."""
        current = self.store.compare_set(EVERY_KEY, "", str(every))
        while int(current) < every:
            current = self.store.compare_set(EVERY_KEY, current.decode(), str(every))

    def _choose(self) -> int:
        if self._fixed is not None:
            return self._fixed
        steps = [b - a for a, b in itertools.pairwise(self._calls)]
        return reads_every(statistics.fmean(self._round_trips), statistics.median(steps) if steps else 0.0)

    def _agree(self, boundary: int) -> None:
        self.agreed = boundary
        if self.boundaries > boundary:
            # Only ranks that do not move in lockstep (no collective per step) get here.
            print(
                f"slurmddp: warning: the ranks agreed to stop at boundary {boundary}, "
                f"which this rank already passed ({self.boundaries}); stopping here",
                file=sys.stderr,
                flush=True,
            )


_agreement: Agreement | None = None
_armed = False


def _open() -> Agreement | None:
    global _agreement
    address = os.environ.get(STORE_ENV)
    if _agreement is None and address:
        # Where torch.distributed's TCPStore is defined; the re-export is untyped.
        from torch._C._distributed_c10d import TCPStore

        host, _, port = address.rpartition(":")
        timeout = timedelta(seconds=float(os.environ.get("SLURMDDP_STOP_TIMEOUT_S", "300")))
        _agreement = Agreement(
            TCPStore(host, int(port), is_master=False, timeout=timeout), every=_read_every()
        )
    return _agreement


def _read_every() -> int | None:
    raw = os.environ.get(READ_EVERY_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{READ_EVERY_ENV}={raw!r}: give a whole number of steps, 1 or more, or leave it unset"
        )
    return int(raw)


def should_stop() -> bool:
    """Whether this job is stopping now: call it once per step on every rank, after the optimizer
    step. True on every rank at the same step, one of the next few after a stop was asked
    (preemption, the time limit, `slurmddp interrupt`; the next where steps are long, up to
    MAX_EVERY where they take milliseconds); then save, and call `exit_for_requeue()`.
    Always False outside a slurmddp job."""
    global _armed
    _armed = True
    agreement = _open()
    return agreement is not None and agreement.should_stop()


def armed() -> bool:
    """Whether this process asked `should_stop()` (it then acts on a SIGTERM at its next boundary
    instead of dying of it)."""
    return _armed


def stopped_at() -> int | None:
    """The boundary this process agreed to stop at, once `should_stop()` said so."""
    if _agreement is None or _agreement.agreed is None:
        return None
    return _agreement.boundaries if _agreement.boundaries >= _agreement.agreed else None


def exit_for_requeue() -> NoReturn:
    """End this rank after the save that followed `should_stop()`: the job is requeued and the
    next attempt resumes from that save."""
    raise StopForRequeue(stopped_at() or 0, signals.received() or signal.SIGTERM)
