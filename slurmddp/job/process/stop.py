"""The stop every rank of a script agrees on: `slurmddp.should_stop()` and `exit_for_requeue()`.

A training script (a plain loop, or a framework's through its integration) asks `should_stop()` at
every step boundary, on every rank. Once a stop was asked (preemption, the time limit, `slurmddp
interrupt`), every rank answers True at the same boundary, and only there: the ranks save the same
step and end together, with no collective run inside a signal handler and none added to the
step.

How the ranks agree. The stop signal reaches every process of the step (Slurm signals them all,
the rank's own process passes SIGTERM on at once); the handler only records it (job/process/signals.py).
At its next boundary, a rank that holds the signal proposes "stop at my boundary count + 1" in the
rendezvous store its rank 0 process hosts (job/script/scriptrank.py); the first proposal wins
(compare-and-set). Every rank reads the key at each boundary, one round trip to that store (10 us
on loopback), and stops when its count reaches the agreed one. That is the same boundary on every
rank because data-parallel ranks move in lockstep: a rank cannot finish step s+1 before every rank
joined step s+1's gradient all-reduce, so when the proposer writes at boundary s, no rank has
passed boundary s+1 yet, and each reads the key before it does. Counting boundaries (calls), not
the script's own step numbers, keeps the answer independent of how a framework numbers its steps.

Outside a slurmddp job (plain `python` or torchrun), `should_stop()` is always False and costs
nothing. Stdlib only at import: `import slurmddp` on a login node stays light.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from slurmddp.job.process import signals

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

STORE_ENV = "SLURMDDP_STOP_STORE"
"""`HOST:PORT` of the job's rendezvous store, set by the rank for its script; absent: no job."""
KEY = "slurmddp/stop-at"
_NONE = "-"
"""What a read-only compare-and-set expects: never a boundary, so it never writes."""


class StopForRequeue(BaseException):
    """Raised once every rank saved after a stop signal: by `ctx.loop`, or by
    `slurmddp.exit_for_requeue()` in a script. The job runs again and resumes from that save.

    A BaseException, so that a user's `except Exception` around the step cannot swallow it.
    """

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"stopped at step {step} on {signals.name(signum)}; the job will be requeued")
        self.step = step
        self.signum = signum


class Agreement:
    """One rank's side of the agreement, over the job's store."""

    def __init__(self, store: Store, heard: Callable[[], int | None] = signals.received) -> None:
        self.store = store
        self.heard = heard
        """Which stop signal this process got, if any."""
        self.boundaries = 0
        self.agreed: int | None = None

    def should_stop(self) -> bool:
        self.boundaries += 1
        if self.agreed is None:
            if self.heard() is not None:
                value = self.store.compare_set(KEY, "", str(self.boundaries + 1))
            else:
                value = self.store.compare_set(KEY, _NONE, _NONE)
            if value.decode() != _NONE:
                self.agreed = int(value)
                if self.boundaries > self.agreed:
                    # Only ranks that do not move in lockstep (no collective per step) get here.
                    print(
                        f"slurmddp: warning: the ranks agreed to stop at boundary {self.agreed}, "
                        f"which this rank already passed ({self.boundaries}); stopping here",
                        file=sys.stderr,
                        flush=True,
                    )
        return self.agreed is not None and self.boundaries >= self.agreed


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
        _agreement = Agreement(TCPStore(host, int(port), is_master=False, timeout=timeout))
    return _agreement


def should_stop() -> bool:
    """Whether this job is stopping now: call it once per step on every rank, after the optimizer
    step. True on every rank at the same step, the first boundary after a stop was asked
    (preemption, the time limit, `slurmddp interrupt`); then save, and call `exit_for_requeue()`.
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
