"""The goodput split (manage/goodput.py) worked out from attempt records alone: a run crashed and
restarted in its allocation (redoing the steps since its checkpoint), preempted and requeued,
then completed; every second of the allocations lands in one part, and the parts add up."""

from __future__ import annotations

import pytest

from slurmddp.manage import goodput
from slurmddp.rundir.records import AttemptId, Begin, End, Phases, Progress, Resubmit

JOB = AttemptId("7", 0)


def begin(attempt: int, at: float, restart: int = 0, in_job: int = 0) -> Begin:
    return Begin(attempt, at, "node1", "node[1-2]", AttemptId("7", restart, in_job))


def end(
    reason: str, step: int, at: float, phases: Phases | None, *, in_job: bool = False, final: bool = False
) -> End:
    return End(reason, step, at, requeue=not final, final=final, message=reason, in_job=in_job, phases=phases)


# Submitted at 0; queued 10 s. Attempt 1: begins at 10, first step (1) at 14, last recorded step
# 150 at 44 (steps 2-150 in 30 s, 2 s of it a save at step 100), crash found at 45. Restarted in
# the allocation at 47: resumes from step 100, first step (101) at 50, steps 102-400 by 110 with
# 3 s of saves; preempted, ends at 112. Requeued: waits until 130; resumes from 400, first step
# at 133, steps 402-600 by 173 with 1 s of saves, completes at 175.
RECORDS = [
    begin(0, 10.0),
    end("failure", 150, 45.0, Phases(0, 14.0, 44.0, 2.0), in_job=True),
    begin(1, 47.0, in_job=1),
    end("preemption", 400, 112.0, Phases(100, 50.0, 110.0, 3.0)),
    begin(2, 130.0, restart=1),
    end("completed", 600, 175.0, Phases(400, 133.0, 173.0, 1.0), final=True),
]


def test_every_second_of_the_allocations_lands_in_one_part() -> None:
    got = goodput.of_run(RECORDS, 0.0, None, running=False, now=1000.0)
    assert got is not None
    # Attempt 2 made steps 102-400 (299 steps) in 60 - 3 s: 57/299 s each; of them 102-150 (49)
    # had been made by attempt 1.
    redone = 49 * 57 / 299
    assert got.starts_s == pytest.approx(4 + 3 + 3)
    assert got.checkpoints_s == pytest.approx(2 + 3 + 1)
    assert got.redone_s == pytest.approx(redone)
    assert got.stops_s == pytest.approx(1 + 2 + 2)
    assert got.restarts_s == pytest.approx(2)
    assert got.queue_s == pytest.approx(10 + 18)
    assert got.training_s == pytest.approx((30 - 2) + (60 - 3 - redone) + (40 - 1))
    assert got.allocated_s == pytest.approx((45 - 10) + 2 + (112 - 47) + (175 - 130))
    parts = got.training_s + got.starts_s + got.checkpoints_s + got.redone_s + got.stops_s + got.restarts_s
    assert parts == pytest.approx(got.allocated_s)
    assert got.share == pytest.approx(got.training_s / got.allocated_s)


def test_a_running_attempt_counts_to_now_from_its_progress_and_a_waiting_run_queues_to_now() -> None:
    running = [*RECORDS[:4], begin(2, 130.0, restart=1)]
    progress = Progress(
        500, AttemptId("7", 1), 160.0, None, started_step=400, first_step_at=133.0, save_s=1.0
    )
    got = goodput.of_run(running, 0.0, progress, running=True, now=165.0)
    assert got is not None and got.stops_s == pytest.approx(1 + 2 + 5)
    assert got.allocated_s == pytest.approx(35 + 2 + 65 + 35)
    waiting = goodput.of_run(RECORDS[:4], 0.0, None, running=True, now=150.0)
    assert waiting is not None and waiting.queue_s == pytest.approx(10 + 38)


def test_idle_spares_take_their_share_of_the_goodput() -> None:
    plain = goodput.of_run(RECORDS, 0.0, None, running=False, now=1000.0)
    spared = goodput.of_run(RECORDS, 0.0, None, running=False, now=1000.0, spare_share=1 / 3)
    assert plain is not None and spared is not None and plain.share is not None
    assert spared.share == pytest.approx(plain.share * 2 / 3)
    assert spared.spares_s == pytest.approx(spared.allocated_s / 3)
    assert "idle spares 33.3% of the nodes' time" in goodput.describe(spared)


def test_an_attempt_that_made_no_step_is_all_start_and_a_resubmit_queues_afresh() -> None:
    records = [
        *RECORDS,
        Resubmit(500.0, ["resubmit"]),
        begin(3, 520.0, restart=0),
        end("failure", 600, 530.0, None, final=True),
    ]
    got = goodput.of_run(records, 0.0, None, running=False, now=1000.0)
    before = goodput.of_run(RECORDS, 0.0, None, running=False, now=1000.0)
    assert got is not None and before is not None
    assert got.starts_s == pytest.approx(before.starts_s + 10)
    assert got.queue_s == pytest.approx(before.queue_s + 20)


def test_records_of_a_version_without_phases_have_no_goodput_and_a_sweep_sums_its_elements() -> None:
    old = [begin(0, 10.0), end("completed", 600, 70.0, None, final=True)]
    assert goodput.of_run(old, 0.0, None, running=False, now=100.0) is None
    one = goodput.of_run(RECORDS, 0.0, None, running=False, now=1000.0)
    assert one is not None
    both = goodput.total([one, None, one])
    assert both is not None and both.allocated_s == pytest.approx(2 * one.allocated_s)
    assert both.share == pytest.approx(one.share)
    line = goodput.describe(one)
    assert line.startswith(f"goodput {100 * one.share:.1f}% of 147.0 s allocated: training ")
    assert "steps redone 9.3 s (6.4%)" in line and line.endswith("queue 28.0 s (not allocated)")


def test_a_cancelled_attempt_trains_until_its_progress_says_it_stopped() -> None:
    # `cancel` writes the end record from the login node, before the ranks stop: it knows no
    # phases, and a run cancelled after 659 steps once read "training 0.0 s".
    cancelled = End("cancelled", None, 60.0, requeue=False, final=True, message="cancelled by the user")
    records = [begin(0, 10.0), cancelled]
    progress = Progress(300, AttemptId("7", 0), 58.0, None, started_step=0, first_step_at=14.0, save_s=2.0)
    got = goodput.of_run(records, 0.0, progress, running=False, now=100.0)
    assert got is not None
    assert got.training_s == pytest.approx(58 - 14 - 2)
    assert got.starts_s == pytest.approx(4) and got.stops_s == pytest.approx(2)
    # Another attempt's progress is not this one's.
    other = Progress(300, AttemptId("8", 0), 58.0, None, started_step=0, first_step_at=14.0, save_s=2.0)
    alone = goodput.of_run(records, 0.0, other, running=False, now=100.0)
    assert alone is not None and alone.training_s == 0 and alone.starts_s == pytest.approx(50)
