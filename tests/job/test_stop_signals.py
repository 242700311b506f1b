"""job/process/signals.py: the stop signals are routed to the flag, and the SIGCONT Slurm sends
with every stop is left to its default action, without submitit's warning handler."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from slurmddp.job.process import signals


@pytest.fixture
def handlers() -> Iterator[None]:
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR2, signal.SIGCONT)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("handlers")
def test_sigcont_gets_its_default_action_back_from_submitits_warning_handler() -> None:
    warned: list[int] = []
    signal.signal(signal.SIGCONT, lambda signum, _: warned.append(signum))  # as submitit's bypass
    signals.install(("USR2",))
    assert signal.getsignal(signal.SIGCONT) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR2) == signals._record
    signal.raise_signal(signal.SIGCONT)
    assert warned == []
