"""The stop a script's ranks agree on (job/process/stop.py): every rank answers True first at the same
boundary, whichever rank heard the signal and however the ranks interleave within the lockstep
that a collective per step imposes."""

from __future__ import annotations

import random
import signal
from datetime import timedelta
from functools import partial

import pytest

from slurmddp.job.process import stop
from slurmddp.job.process.stop import MAX_EVERY, OTHER_NODE_RTT_S, WARMUP, Agreement, reads_every


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
    every = rng.choice([1, 3, 7])
    order = lockstep_schedule(rng, ranks, WARMUP + 4 * every + 12)
    # The signal reaches some ranks (one, several or all) at random moments of the schedule, the
    # first of them before or after the ranks read how often they read the key.
    # (Early enough for the agreed boundary to be in the schedule.)
    latest = len(order) - ranks * (every + 3)
    heard_at = {r: rng.randrange(latest) for r in rng.sample(range(ranks), rng.randint(1, ranks))}
    clock = 0

    def heard(rank: int) -> int | None:
        return signal.SIGUSR2 if clock >= heard_at.get(rank, len(order)) else None

    agreements = [Agreement(store_factory(), heard=partial(heard, r), every=every) for r in range(ranks)]
    first_true: dict[int, int] = {}
    first_heard_boundary = None
    for clock, r in enumerate(order):
        a = agreements[r]
        if r in heard_at and clock >= heard_at[r] and first_heard_boundary is None:
            first_heard_boundary = a.boundaries + 1
        if a.should_stop() and r not in first_true:
            first_true[r] = a.boundaries
    assert set(first_true) == set(range(ranks)), (first_true, every)
    assert len(set(first_true.values())) == 1, first_true
    # At the latest K boundaries after the first rank that heard it got to ask.
    assert first_heard_boundary is not None
    assert first_true[0] <= first_heard_boundary + every, (first_true, first_heard_boundary, every)
    # Every rank that got past the warm-up unstopped read rank 0's K.
    assert all(a.every == every for r, a in enumerate(agreements) if first_true[r] > WARMUP + 1)


class Counted:
    """A store that counts the round trips made through it."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.trips: list[str] = []

    def __getattr__(self, name: str) -> object:
        method = getattr(self.store, name)

        def counted(*args: object) -> object:
            self.trips.append(name)
            return method(*args)

        return counted


def test_the_ranks_read_only_every_k_boundaries_after_the_warmup(store_factory) -> None:  # type: ignore[no-untyped-def]
    stores = [Counted(store_factory()) for _ in range(3)]
    agreements = [Agreement(s, heard=lambda: None, every=10) for r, s in enumerate(stores)]  # type: ignore[arg-type]
    for _ in range(WARMUP + 1 + 50):
        for agreement in agreements:
            assert not agreement.should_stop()
    reads = [*range(1, WARMUP + 2), *range(WARMUP + 11, WARMUP + 52, 10)]
    assert [b for b in range(1, WARMUP + 52) if agreements[1]._reads(b)] == reads
    # Every rank also offered its K once, and read the largest once, at WARMUP + 1.
    assert all(s.trips.count("get") == 1 and s.trips.count("compare_set") == len(reads) + 1 for s in stores)


def test_the_largest_k_offered_is_every_ranks(store_factory) -> None:  # type: ignore[no-untyped-def]
    offers = [3, 9, 5, 1]
    agreements = [Agreement(store_factory(), heard=lambda: None, every=k) for r, k in enumerate(offers)]
    for _ in range(WARMUP + 1):
        for agreement in agreements:
            agreement.should_stop()
    assert [a.every for a in agreements] == [9] * len(offers)


def test_k_keeps_the_round_trips_under_a_quarter_percent_of_the_step() -> None:
    # 0.3 ms round trips (busy cores) and 4 ms steps: one read in 30 steps, 0.25% of the time.
    assert reads_every(0.0003, 0.004) == 30
    # A GPU step of 100 ms: every boundary reads; a round trip over loopback counts as one from
    # another node's.
    assert reads_every(0.00002, 0.1) == 1
    assert reads_every(0.00002, 0.01) == reads_every(OTHER_NODE_RTT_S, 0.01) == 4
    assert reads_every(0.001, 0.0001) == MAX_EVERY


def test_no_signal_never_stops_and_writes_nothing(store_factory) -> None:  # type: ignore[no-untyped-def]
    agreement = Agreement(store_factory(), heard=lambda: None)
    assert not any(agreement.should_stop() for _ in range(50))
    assert not agreement.store.check([stop.KEY])


def test_k_can_be_fixed_in_the_environment_and_a_wrong_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(stop.READ_EVERY_ENV, "1")
    assert stop._read_every() == 1
    monkeypatch.setenv(stop.READ_EVERY_ENV, "")
    assert stop._read_every() is None
    for wrong in ["0", "-2", "every"]:
        monkeypatch.setenv(stop.READ_EVERY_ENV, wrong)
        with pytest.raises(ValueError, match=f"SLURMDDP_STOP_READ_EVERY='{wrong}': give a whole number"):
            stop._read_every()


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
