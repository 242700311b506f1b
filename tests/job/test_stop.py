"""The stop a script's ranks agree on (job/process/stop.py): every rank answers True first at the same
boundary, whichever rank heard the signal and however the ranks interleave within the lockstep
that a collective per step imposes."""

from __future__ import annotations

import random
import signal
from datetime import timedelta

import pytest

from slurmddp.job.process import stop
from slurmddp.job.process.stop import Agreement


@pytest.fixture
def store_factory():  # type: ignore[no-untyped-def]
    from torch._C._distributed_c10d import TCPStore

    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)

    def client() -> TCPStore:
        return TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=10))

    yield client


def lockstep_schedule(rng: random.Random, ranks: int, boundaries: int) -> list[int]:
    """An order of (rank) calls in which no rank makes its (b+1)-th call before every rank made
    its b-th: a rank cannot finish step b+1 before all joined step b+1's all-reduce."""
    made = [0] * ranks
    order = []
    while min(made) < boundaries:
        ready = [r for r in range(ranks) if made[r] < boundaries and made[r] <= min(made)]
        r = rng.choice(ready)
        made[r] += 1
        order.append(r)
    return order


@pytest.mark.parametrize("seed", range(16))
def test_every_rank_stops_at_the_same_boundary_whoever_heard_it(store_factory, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    ranks = rng.choice([3, 4, 5])
    order = lockstep_schedule(rng, ranks, 30)
    # The signal reaches some ranks (one, several or all) at random moments of the schedule.
    heard_at = {r: rng.randrange(len(order)) for r in rng.sample(range(ranks), rng.randint(1, ranks))}
    clock = 0

    def heard(rank: int) -> int | None:
        return signal.SIGUSR2 if clock >= heard_at.get(rank, len(order)) else None

    agreements = [Agreement(store_factory(), heard=lambda r=r: heard(r)) for r in range(ranks)]
    first_true: dict[int, int] = {}
    first_heard_boundary = None
    for clock, r in enumerate(order):
        a = agreements[r]
        if r in heard_at and clock >= heard_at[r] and first_heard_boundary is None:
            first_heard_boundary = a.boundaries + 1
        if a.should_stop() and r not in first_true:
            first_true[r] = a.boundaries
    assert set(first_true) == set(range(ranks)), first_true
    assert len(set(first_true.values())) == 1, first_true
    # At the latest one boundary after the first rank that heard it got to ask.
    assert first_heard_boundary is not None
    assert first_true[0] <= first_heard_boundary + 1


def test_no_signal_never_stops_and_writes_nothing(store_factory) -> None:  # type: ignore[no-untyped-def]
    agreement = Agreement(store_factory(), heard=lambda: None)
    assert not any(agreement.should_stop() for _ in range(50))
    assert not agreement.store.check([stop.KEY])


def test_outside_a_job_should_stop_is_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stop.STORE_ENV, raising=False)
    monkeypatch.setattr(stop, "_agreement", None)
    assert stop.should_stop() is False
    assert stop.stopped_at() is None


def test_exit_for_requeue_names_the_step_and_the_signal(  # type: ignore[no-untyped-def]
    store_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    agreement = Agreement(store_factory(), heard=lambda: signal.SIGUSR2)
    monkeypatch.setattr(stop, "_agreement", agreement)
    monkeypatch.setattr(stop.signals, "_received", signal.SIGUSR2)
    assert [agreement.should_stop() for _ in range(3)] == [False, True, True]
    with pytest.raises(stop.StopForRequeue) as raised:
        stop.exit_for_requeue()
    assert raised.value.signum == signal.SIGUSR2
    assert str(raised.value).startswith("stopped at step 3 on SIGUSR2")
