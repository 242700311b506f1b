"""Each rule of the requeue policy (job/allocation/requeue.py) on its own: the decision it makes for
what happened, and where it leaves the decision to the rules after it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.experiment.schema import Requeue, Resources
from slurmddp.job.allocation import requeue
from slurmddp.job.allocation.outcome import Local, Outcome, Settings, Slurm
from slurmddp.job.allocation.requeue import Decision
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, CodeSite, End, Failure, Progress, Stop

ME = AttemptId("77", 1)
ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node[1-3]"}
NOW = time.time()
ERROR = "RuntimeError('boom')"
NAME_ERROR = {"exception": "NameError", "where": CodeSite("/src/train.py", 12, "train")}


def slurm(
    preempt: str | None = None,
    left: float | None = 500.0,
    partition: int | None = 8,
    down: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> Slurm:
    """What Slurm says: squeue's PreemptTime and TimeLeft, the partition's size, the nodes gone down."""
    return Slurm(
        env or ENV,
        preempt_time=lambda job: preempt,
        time_left=lambda job: left,
        partition_nodes=lambda name: partition,
        failed_nodes=lambda nodes, since: {h: why for h, why in (down or {}).items() if h in nodes},
    )


def failed(step: int | None = 5, **fields: Any) -> Failure:
    return Failure(step, 1, fields.pop("error", ERROR), ME, NOW, **fields)


def ended(reason: str, step: int | None, *, in_job: bool = False, signature: str | None = None) -> End:
    return End(
        reason,
        step,
        NOW - 100,
        True,
        False,
        "m",
        0,
        1,
        AttemptId("77", 0),
        in_job=in_job,
        signature=signature,
    )  # type: ignore[arg-type]


def what(
    tmp_path: Path,
    *,
    status: int = 1,
    stop: Stop | None = None,
    failure: Failure | None = None,
    history: tuple[End, ...] = (),
    scheduler: Slurm | Local | None = None,
    me: AttemptId = ME,
    nodes: str = "node[1-2]",
    requeue_settings: Requeue | None = None,
    resources: Resources | None = None,
) -> Outcome:
    """What happened to attempt `me`, which began on `nodes` after the attempts that ended `history`."""
    era: list[records.AttemptEvent] = [*history, Begin(len(history), NOW - 50, "h", nodes, me)]
    settings = Settings(requeue_settings or Requeue(), resources or Resources(nodes=2))
    return Outcome(tmp_path, me, status, stop, failure, era, scheduler or slurm(), settings)


def stopped(step: int | None = 10, signal: str = "SIGUSR2", me: AttemptId = ME) -> Stop:
    return Stop(step, signal, NOW - 1, me, NOW - 1)


def test_the_docstring_lists_the_rules_in_their_order() -> None:
    listed = [line.split()[0] for line in (requeue.__doc__ or "").splitlines() if line.startswith("    ")]
    assert listed == [rule.__name__ for rule in requeue.RULES] + ["through_the_queue"]


def test_completed_when_every_rank_returned_or_the_ranks_ended_0_without_a_stop(tmp_path: Path) -> None:
    Progress(42, ME, NOW).write(tmp_path)
    assert requeue.completed(what(tmp_path, status=0)) == Decision("completed", 42, False, "completed")
    # A stop signal landing while the finished ranks exit: result.json of this attempt says done.
    (tmp_path / "result.json").write_text(json.dumps(ME.to_json()))
    assert requeue.completed(what(tmp_path, status=140, stop=stopped())) is not None


def test_completed_leaves_a_stop_or_a_crash_to_the_rules_after_it(tmp_path: Path) -> None:
    assert requeue.completed(what(tmp_path, status=0, stop=stopped())) is None
    assert requeue.completed(what(tmp_path, status=1)) is None


def test_local_failure_is_final_and_says_what_failed(tmp_path: Path) -> None:
    local = Local(6, "SIGUSR2")
    decision = requeue.local_failure(what(tmp_path, failure=failed(7), scheduler=local))
    message = f"failure at step 7: {ERROR}; a local run is not retried"
    signature = "a rank ended without a word at step 7"
    assert decision == Decision("failure", 7, False, message, signature=signature)
    unrecorded = requeue.local_failure(what(tmp_path, status=3, scheduler=local))
    assert (
        unrecorded is not None
        and unrecorded.message == "failure (rank 0 left with status 3); a local run is not retried"
    )


def test_local_failure_leaves_slurm_and_a_local_stop_to_the_rules_after_it(tmp_path: Path) -> None:
    assert requeue.local_failure(what(tmp_path, failure=failed(7))) is None
    local_stop = what(tmp_path, status=LOCAL_REQUEUE_STATUS, stop=stopped(), scheduler=Local(6, "SIGUSR2"))
    assert requeue.local_failure(local_stop) is None


def test_refused_retry_is_final_where_no_node_is_to_blame(tmp_path: Path) -> None:
    refusal = failed(None, error="preflight failed", retry=False)
    decision = requeue.refused_retry(what(tmp_path, failure=refusal))
    assert decision is not None and (decision.requeue, decision.message) == (
        False,
        "preflight failed: not retrying",
    )
    blamed = failed(None, error="preflight failed", retry=False, bad_hosts={"node2": "slow"})
    assert requeue.refused_retry(what(tmp_path, failure=blamed)) is None


def test_same_step_twice_is_final(tmp_path: Path) -> None:
    decision = requeue.same_step_twice(what(tmp_path, failure=failed(9), history=(ended("failure", 9),)))
    assert decision is not None and decision.message == "crashed at step 9 twice in a row: not retrying"
    assert requeue.same_step_twice(what(tmp_path, failure=failed(9), history=(ended("failure", 8),))) is None
    # Another node next time: a broken node's crash at the same step is not the code's.
    broken = failed(9, bad_hosts={"node2": "ECC errors"})
    assert requeue.same_step_twice(what(tmp_path, failure=broken, history=(ended("failure", 9),))) is None


def test_same_failure_twice_without_a_step_gained_is_final(tmp_path: Path) -> None:
    before = (ended("failure", None, signature="NameError at /src/train.py:12"),)
    decision = requeue.same_failure_twice(what(tmp_path, failure=failed(None, **NAME_ERROR), history=before))
    assert decision is not None and decision.requeue is False
    assert decision.message == "the same failure twice in a row (NameError at /src/train.py:12): not retrying"
    # Slurm saw a node go down under it: its own word, not the ranks'.
    down = slurm(down={"node2": "DOWN"})
    outcome = what(tmp_path, failure=failed(None, **NAME_ERROR), history=before, scheduler=down)
    assert requeue.same_failure_twice(outcome) is None


def test_nodes_needed_is_final_where_the_job_cannot_run_without_them(tmp_path: Path) -> None:
    pinned = Resources(nodes=2, sbatch={"nodelist": "node[1-2]"})
    bad = failed(5, error="preflight failed", bad_hosts={"node2": "slow"})
    decision = requeue.nodes_needed(what(tmp_path, failure=bad, resources=pinned))
    assert decision is not None and decision.message == (
        "preflight failed: the job's resources.sbatch.nodelist names node2, so it cannot run without it: "
        "not retrying"
    )
    small = slurm(partition=2, env={**ENV, "SLURM_JOB_PARTITION": "debug"})
    decision = requeue.nodes_needed(what(tmp_path, failure=bad, scheduler=small))
    assert (
        decision is not None
        and "would leave 1 of partition debug's 2 nodes for a job of 2" in decision.message
    )
    assert requeue.nodes_needed(what(tmp_path, failure=bad)) is None


def test_restart_on_spare_leaves_a_bad_node_out_for_good(tmp_path: Path) -> None:
    spare = Resources(nodes=2, spare_nodes=1)
    bad = failed(5, bad_hosts={"node2": "ECC errors"})
    decision = requeue.restart_on_spare(what(tmp_path, failure=bad, resources=spare))
    message = "failure at step 5; leaving out node2; restart 1 of 3 in this allocation on node3 instead"
    signature = "a rank ended without a word at step 5"
    assert decision == Decision(
        "failure", 5, True, message, {"node2": "ECC errors"}, in_job=True, signature=signature
    )


def test_restart_on_spare_sets_a_suspect_aside_for_this_allocation(tmp_path: Path) -> None:
    spare = Resources(nodes=2, spare_nodes=1)
    suspect = failed(5, suspect_hosts={"node2": "its ranks died together"})
    decision = requeue.restart_on_spare(what(tmp_path, failure=suspect, resources=spare))
    assert decision is not None and (decision.leave_out, decision.set_aside) == (
        {},
        {"node2": "its ranks died together"},
    )
    assert decision.message == (
        "failure at step 5 (node2: its ranks died together); leaving out node2 for this allocation; "
        "restart 1 of 3 in this allocation on node3 instead"
    )
    # Without a spare a suspect keeps its ranks; with no restarts left the queue takes over.
    assert requeue.restart_on_spare(what(tmp_path, failure=suspect)) is None
    spent = Requeue(in_job_restarts=0)
    assert (
        requeue.restart_on_spare(what(tmp_path, failure=suspect, resources=spare, requeue_settings=spent))
        is None
    )


def test_restart_in_job_while_restarts_without_progress_last(tmp_path: Path) -> None:
    decision = requeue.restart_in_job(what(tmp_path, failure=failed(5, cause="rank 1 hung")))
    assert decision is not None and (decision.requeue, decision.in_job) == (True, True)
    assert decision.message == "failure at step 5 (rank 1 hung); restart 1 of 3 in this allocation"
    # The restart before this one gained nothing: the allocation's restarts are used up.
    before = (ended("failure", 5, in_job=True, signature="x"),)
    one = Requeue(in_job_restarts=1)
    assert (
        requeue.restart_in_job(what(tmp_path, failure=failed(4), history=before, requeue_settings=one))
        is None
    )
    # A node to leave out is the spare's or the queue's.
    assert requeue.restart_in_job(what(tmp_path, failure=failed(5, bad_hosts={"node2": "gone"}))) is None


def test_budget_spent_counts_requeues_not_restarts_in_the_allocation(tmp_path: Path) -> None:
    one = Requeue(max_preemptions=1)
    preempted = slurm(preempt="2026-01-01T00:00:00")
    before = (ended("preemption", 5), ended("failure", 6, in_job=True))
    decision = requeue.budget_spent(
        what(tmp_path, stop=stopped(), history=before, scheduler=preempted, requeue_settings=one)
    )
    assert decision == Decision("preemption", 10, False, "preemption budget spent (1 requeues of 1 allowed)")
    left = (ended("failure", 6, in_job=True),)
    outcome = what(tmp_path, stop=stopped(), history=left, scheduler=preempted, requeue_settings=one)
    assert requeue.budget_spent(outcome) is None


def test_last_start_of_the_local_controller_is_final(tmp_path: Path) -> None:
    sixth = AttemptId("77", 5)
    local = Local(6, "SIGUSR2")
    outcome = what(tmp_path, status=LOCAL_REQUEUE_STATUS, stop=stopped(me=sixth), scheduler=local, me=sixth)
    decision = requeue.last_start(outcome)
    message = "timeout at step 10; submitit's local executor starts a job at most 6 times: not restarting"
    assert decision == Decision("timeout", 10, False, message)
    fifth = AttemptId("77", 4)
    earlier = what(tmp_path, status=LOCAL_REQUEUE_STATUS, stop=stopped(me=fifth), scheduler=local, me=fifth)
    assert requeue.last_start(earlier) is None
    # Slurm has no such limit.
    assert requeue.last_start(what(tmp_path, stop=stopped(), me=sixth, scheduler=slurm(preempt="x"))) is None


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        ("SIGUSR2", "timeout at step 10; requeue 1 (budget 20)"),
        ("SIGTERM", "preemption at step 10 (SIGTERM from outside slurmddp); requeue 1 (budget unlimited)"),
    ],
)
def test_through_the_queue_takes_a_local_stop_for_what_its_signal_says(
    tmp_path: Path, signal: str, expected: str
) -> None:
    local = Local(6, "SIGUSR2")
    outcome = what(tmp_path, status=LOCAL_REQUEUE_STATUS, stop=stopped(signal=signal), scheduler=local)
    decision = requeue.through_the_queue(outcome)
    assert (decision.requeue, decision.message) == (True, expected)


def test_through_the_queue_requeues_a_failure_without_its_bad_node(tmp_path: Path) -> None:
    bad = failed(5, bad_hosts={"node2": "ECC errors"})
    decision = requeue.through_the_queue(what(tmp_path, failure=bad))
    assert decision == Decision(
        "failure",
        5,
        True,
        "failure at step 5; leaving out node2; requeue 1 (budget 3)",
        {"node2": "ECC errors"},
        signature="a rank ended without a word at step 5",
    )
    # A preemption leaves nothing out.
    preempted = requeue.through_the_queue(what(tmp_path, stop=stopped(), scheduler=slurm(preempt="x")))
    assert preempted == Decision(
        "preemption", 10, True, "preemption at step 10; requeue 1 (budget unlimited)"
    )
