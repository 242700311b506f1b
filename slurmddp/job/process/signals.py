"""The stop-signal flag of a rank. The handler only records the signal: saving or communicating
inside a handler can deadlock or corrupt (a handler may run in the middle of a collective or of a
torch.save); the training loop acts on the flag at the next step boundary.

Stdlib only: it is installed before torch and the user's code are imported, because a signal that
lands before any handler kills the rank (USR2's default action is to terminate).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType

_received: int | None = None
_received_at: float | None = None
_then: Callable[[int], None] | None = None


def _record(signum: int, frame: FrameType | None) -> None:
    global _received, _received_at
    if _received is None:
        _received, _received_at = signum, time.time()
    if _then is not None:
        _then(signum)


def install(names: tuple[str, ...], then: Callable[[int], None] | None = None) -> None:
    """Route each named signal (e.g. "USR2", "TERM") to the flag. `then(signum)` runs after each
    is recorded; it runs in the main thread between two bytecodes, as any Python handler does, so
    it may call os.kill but must not save or communicate."""
    global _then
    _then = then
    for name in names:
        signal.signal(getattr(signal, f"SIG{name}"), _record)
    # Slurm sends SIGCONT with every stop and requeue, and submitit's handler for it logs "Bypassing
    # signal SIGCONT" on every rank, a warning about nothing: the default action (a stopped
    # process goes on) is all it needs.
    signal.signal(signal.SIGCONT, signal.SIG_DFL)


def ignore(names: tuple[str, ...]) -> None:
    """Ignore each named signal from now on (CPython leaves SIG_IGN in place at shutdown)."""
    for name in names:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)


def received() -> int | None:
    """The first stop signal this process got, if any."""
    return _received


def stopping() -> bool:
    """Whether a stop signal came: the step is ending."""
    return _received is not None


def received_at() -> float | None:
    """When (time.time()) the first stop signal arrived."""
    return _received_at


def name(signum: int) -> str:
    return signal.Signals(signum).name
