"""A local run's attempts, recorded by its rank 0 (no batch script): which attempt starts, and how
each ended (completed, a stop counted as preemption or timeout, a failure), with budgets and the
local controller's limit of starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.job.allocation import attempts
from slurmddp.rundir import records
from slurmddp.rundir.records import CANCELLED, AttemptId, CodeSite, End, Failure, Interrupt, Resubmit, Stop

JOB = "4242"


def run_dir(tmp_path: Path, **budgets: int) -> Path:
    tmp_path.mkdir(exist_ok=True)
    lines = "".join(f"  {key}: {value}\n" for key, value in budgets.items())
    (tmp_path / "config.yaml").write_text(f"resources:\n  time: 00:10:00\nrequeue:\n{lines or '  {}'}\n")
    return tmp_path


def start(path: Path) -> AttemptId:
    """What every rank of the attempt starting now counts, and rank 0's record of its begin."""
    me = records.local_attempt(records.read_attempts(path), JOB)
    attempts.begin_local(path, me, "laptop", time.time())
    return me


def stopped(path: Path, me: AttemptId, signal: str = "SIGUSR2", reason: str | None = None) -> End | None:
    if reason is not None:
        Interrupt(reason, me).write(path)  # type: ignore[arg-type]
    Stop(10 * (me.restart_count + 1), signal, time.time(), me, time.time()).write(path)
    return attempts.end_local(path, me, LOCAL_REQUEUE_STATUS, time.time())


def test_each_restart_is_the_next_attempt_and_a_resubmit_starts_a_job_afresh(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    first = start(path)
    assert first == AttemptId(JOB, 0)
    # Another rank of the same attempt, starting after rank 0's begin, counts the same.
    assert records.local_attempt(records.read_attempts(path), JOB) == first
    stopped(path, first, reason="preemption")
    assert start(path) == AttemptId(JOB, 1)
    records.append_attempt(path, Resubmit(time.time(), ["resubmit"]))
    assert records.local_attempt(records.read_attempts(path), "5151") == AttemptId("5151", 0)
    begins = records.begins(records.read_attempts(path))
    assert [(b.attempt, b.attempt_id.restart_count, b.host) for b in begins] == [
        (0, 0, "laptop"),
        (1, 1, "laptop"),
    ]


def test_interrupt_names_the_reason_of_a_stop(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    preempted = stopped(path, start(path), reason="preemption")
    timed_out = stopped(path, start(path), reason="timeout")
    assert preempted is not None and timed_out is not None
    shown = [(e.reason, e.step, e.requeue, e.final, e.status) for e in (preempted, timed_out)]
    assert shown == [
        ("preemption", 10, True, False, LOCAL_REQUEUE_STATUS),
        ("timeout", 20, True, False, LOCAL_REQUEUE_STATUS),
    ]
    assert preempted.message == "preemption at step 10; requeue 1 (budget unlimited)"
    assert timed_out.attempt_id == AttemptId(JOB, 1) and timed_out.attempt == 1


def test_a_stop_nobody_named_is_the_local_time_limit_or_a_signal_from_outside(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    # submitit's local controller sends USR2 near resources.time.
    timed_out = stopped(path, start(path), signal="SIGUSR2")
    killed = stopped(path, start(path), signal="SIGTERM")
    assert timed_out is not None and timed_out.reason == "timeout"
    assert killed is not None and killed.reason == "preemption"
    assert "SIGTERM from outside slurmddp" in killed.message


def test_a_spent_budget_and_the_controllers_last_start_end_the_run(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_timeouts=1)
    assert stopped(path, start(path), reason="timeout") is not None
    spent = stopped(path, start(path), reason="timeout")
    assert spent is not None and (spent.requeue, spent.final) == (False, True)
    assert "timeout budget spent (1 requeues of 1 allowed)" in spent.message
    # The next start the controller makes finds the run ended (job/launch/runtime.py).
    assert records.final_end(records.read_attempts(path)) == spent

    other = run_dir(tmp_path / "other")
    for _ in range(attempts.LOCAL_STARTS - 1):
        ended = stopped(other, start(other), reason="preemption")
        assert ended is not None and ended.requeue
    last = stopped(other, start(other), reason="preemption")
    assert last is not None and last.final and "at most 6 times" in last.message


def test_completion_and_failure_are_final(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    me = start(path)
    completed = attempts.end_local(path, me, 0, time.time())
    assert completed is not None and (completed.reason, completed.final, completed.message) == (
        "completed",
        True,
        "completed",
    )
    failed_dir = run_dir(tmp_path / "failed")
    me = start(failed_dir)
    Failure(7, 1, "RuntimeError('rank 1 gave up')", me, time.time()).write(failed_dir)
    failed = attempts.end_local(failed_dir, me, 1, time.time())
    assert failed is not None and (failed.reason, failed.step, failed.requeue) == ("failure", 7, False)
    assert failed.message == "failure at step 7: RuntimeError('rank 1 gave up'); a local run is not retried"


def test_a_local_failure_says_what_failed_as_on_slurm(tmp_path: Path) -> None:
    """Never retried, with or without a step; its end names the failure as a Slurm run's does."""
    path = run_dir(tmp_path)
    me = start(path)
    where = CodeSite("/src/train.py", 3, "train")
    Failure(None, 1, "NameError('modle')", me, time.time(), exception="NameError", where=where).write(path)
    failed = attempts.end_local(path, me, 1, time.time())
    assert failed is not None and (failed.requeue, failed.final) == (False, True)
    assert failed.signature == "NameError at /src/train.py:3"
    assert failed.message == "failure: NameError('modle'); a local run is not retried"


def test_an_attempt_is_closed_once_and_never_after_a_cancel(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    me = start(path)
    assert attempts.end_local(path, me, 0, time.time()) is not None
    assert attempts.end_local(path, me, 0, time.time()) is None
    cancelled_dir = run_dir(tmp_path / "cancelled")
    me = start(cancelled_dir)
    records.append_attempt(
        cancelled_dir, End(CANCELLED, None, time.time(), False, True, "cancelled by the user")
    )
    assert stopped(cancelled_dir, me) is None
    assert [e.reason for e in records.ends(records.read_attempts(cancelled_dir))] == [CANCELLED]


@pytest.mark.parametrize("status", [LOCAL_REQUEUE_STATUS, 0])
def test_a_stop_of_a_finished_attempt_is_still_its_completion(tmp_path: Path, status: int) -> None:
    """result.json of this attempt: every rank returned, whatever came after."""
    path = run_dir(tmp_path)
    me = start(path)
    (path / "result.json").write_text(f'{{"job_id": "{JOB}", "restart_count": 0}}')
    Stop(3, "SIGUSR2", time.time(), me, time.time()).write(path)
    ended = attempts.end_local(path, me, status, time.time())
    assert ended is not None and ended.reason == "completed"


def test_a_line_being_appended_is_not_read_yet(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    me = start(path)
    with (path / "attempts.jsonl").open("a") as handle:
        handle.write('{"event": "end", "reason": "compl')
    assert [type(e).__name__ for e in records.read_attempts(path)] == ["Begin"]
    assert records.local_attempt(records.read_attempts(path), JOB) == me
