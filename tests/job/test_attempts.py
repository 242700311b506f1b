"""The requeue decision of the batch script: reasons, budgets, the same-step crash stop."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from slurmddp.defaults import EXIT_FINISHED, EXIT_RESTART_IN_JOB, IN_JOB_RESTART_ENV
from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Requeue
from slurmddp.job.allocation import attempts, outcome
from slurmddp.rundir import records
from slurmddp.rundir.records import (
    AttemptId,
    CodeSite,
    End,
    Exclusion,
    Exclusions,
    Failure,
    Interrupt,
    Progress,
    Stop,
)

ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-2]"}


def run_dir(tmp_path: Path, resources: str = "", **budgets: int) -> Path:
    lines = "".join(f"  {key}: {value}\n" for key, value in budgets.items())
    config = f"resources:\n  time: 00:10:00\n{resources}requeue:\n{lines or '  {}'}\n"
    (tmp_path / "config.yaml").write_text(config)
    return tmp_path


def stop(path: Path, step: int, restart: int = 0, signal_at: float | None = None) -> None:
    now = time.time()
    Stop(step, "SIGTERM", signal_at, AttemptId("77", restart), now).write(path)


def attempt(
    path: Path,
    restart: int,
    *,
    in_job: int = 0,
    stopped: bool = False,
    failure_step: int | None = None,
    status: int = 0,
    preempt: str | None = None,
    left: float | None = 60.0,
    crashed_before_stop: bool = True,
) -> int:
    """One attempt: `left` is squeue's time left when it ends (the signal came 1 s earlier)."""
    env = {**ENV, "SLURM_RESTART_COUNT": str(restart), IN_JOB_RESTART_ENV: str(in_job)}
    me = AttemptId("77", restart, in_job)
    assert attempts.begin(path, env, now=1000.0 + restart) == 0
    now = time.time()
    if stopped:
        Stop(10 * (restart + 1), "SIGTERM", now - 1, me, now).write(path)
    if failure_step is not None:
        crashed = now - 2 if crashed_before_stop else now
        Failure(failure_step, 0, "", me, crashed).write(path)
    return attempts.end(
        path, status, env, now=1001.0 + restart, preempt_time=lambda job: preempt, time_left=lambda job: left
    )


def ends(path: Path) -> list[End]:
    return records.ends(records.read_attempts(path))


def requeues_in(commands: list[list[str]]) -> list[list[str]]:
    """The scontrol requeues among the Slurm commands run (not the accounting's queries)."""
    return [c for c in commands if c[:2] == ["scontrol", "requeue"]]


@pytest.fixture(autouse=True)
def no_real_slurm(slurm_commands: list[list[str]]) -> None:
    """The requeue decision's scontrol calls are recorded, never run, in every test here."""


def test_completed_is_final(tmp_path: Path, slurm_commands: list[list[str]]) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0) == 0
    assert ends(path)[-1].reason == "completed" and ends(path)[-1].final is True
    assert slurm_commands == []
    assert attempts.begin(path, ENV, now=2000.0) == EXIT_FINISHED


def test_preemption_is_told_by_preempt_time_not_elapsed_time(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, max_timeouts=1)
    attempt(path, 0, stopped=True, preempt="2026-11-22T01:00:00")
    attempt(path, 1, stopped=True, preempt="2026-11-22T01:01:00")
    attempt(path, 2, stopped=True, preempt=None)
    reasons = [(r.reason, r.requeue, r.step) for r in ends(path)]
    assert reasons == [("preemption", True, 10), ("preemption", True, 20), ("timeout", True, 30)]
    assert slurm_commands == [["scontrol", "requeue", "77"]] * 3


def test_timeout_budget(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_timeouts=1)
    assert attempt(path, 0, stopped=True) == 0
    assert attempt(path, 1, stopped=True) == 1
    last = ends(path)[-1]
    assert last.requeue is False and "timeout budget spent" in last.message


def test_failure_budget_and_same_step(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_failures=5, in_job_restarts=0)
    assert attempt(path, 0, status=1, failure_step=7) == 0
    assert attempt(path, 1, status=1, failure_step=9) == 0
    assert attempt(path, 2, status=1, failure_step=9) == 1
    assert "step 9 twice" in str(ends(path)[-1].message)


def test_interrupt_names_the_reason(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    Interrupt("preemption", AttemptId("77", 0)).write(path)
    attempt(path, 0, stopped=True, preempt=None)
    assert ends(path)[-1].reason == "preemption"


def test_stale_records_of_an_earlier_attempt_are_ignored(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    stop(path, 5)
    attempts.begin(path, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=1.0)
    assert (
        attempts.end(path, 0, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=2.0, preempt_time=lambda j: None) == 0
    )
    assert ends(path)[-1].reason == "completed"


def test_a_killed_attempt_is_recorded_at_the_next_begin(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    attempts.begin(path, ENV, now=1.0)
    attempts.begin(path, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=2.0)
    assert [r.reason for r in ends(path)] == ["killed"]


def test_array_tasks_requeue_alone() -> None:
    env = {"SLURM_JOB_ID": "90", "SLURM_ARRAY_JOB_ID": "88", "SLURM_ARRAY_TASK_ID": "2"}
    assert outcome.requeue_target(env) == "88_2"
    assert outcome.requeue_target({"SLURM_JOB_ID": "90"}) == "90"


def test_the_batch_script_does_not_record_an_attempt_twice(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """Rank 0 already recorded and requeued; the batch script's call only repeats the requeue."""
    path = run_dir(tmp_path)
    attempts.begin(path, ENV, now=1.0)
    stop(path, 12)
    assert attempts.end(path, 0, ENV, now=2.0, preempt_time=lambda j: "2026-01-01T00:00:00") == 0
    assert attempts.end(path, 0, ENV, now=3.0, preempt_time=lambda j: None) == 0
    assert [(r.reason, r.step) for r in ends(path)] == [("preemption", 12)]
    assert requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]] * 2


def test_a_run_whose_ranks_all_returned_is_completed_whatever_srun_says(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    # A time-limit signal landing while the finished ranks exit made srun report status 140.
    path = run_dir(tmp_path)
    assert attempts.begin(path, ENV, now=1000.0) == 0
    (path / "result.json").write_text('{"job_id": "77", "restart_count": 0, "result": {}}')
    assert attempts.end(path, 140, ENV, now=1001.0, preempt_time=lambda job: None) == 0
    assert ends(path)[-1].reason == "completed" and slurm_commands == []
    # A result left by an earlier attempt does not count.
    (tmp_path / "later").mkdir()
    later = run_dir(tmp_path / "later", in_job_restarts=0)
    (later / "result.json").write_text('{"job_id": "77", "restart_count": 0}')
    assert attempt(later, 1, status=1) == 0
    assert ends(later)[-1].reason == "failure"


def test_a_stop_long_before_the_time_limit_without_preemption_is_a_failure(tmp_path: Path) -> None:
    """srun's --kill-on-bad-exit SIGTERMs the ranks that survive a crash: rank 0 stops and
    records it, but nothing asked the job to stop."""
    path = run_dir(tmp_path, max_failures=5, in_job_restarts=0)
    assert attempt(path, 0, stopped=True, left=500.0) == 0
    (record,) = ends(path)
    assert record.reason == "failure" and record.requeue is True
    assert "SIGTERM with 501 s of the time limit left" in record.message
    # Within the signal's lead (120 s by default, Slurm up to 60 s early): the time limit.
    assert attempt(path, 1, stopped=True, left=170.0) == 0
    assert ends(path)[-1].reason == "timeout"
    # No time limit to go by: the signal is believed.
    assert attempt(path, 2, stopped=True, left=None) == 0
    assert ends(path)[-1].reason == "timeout"


def test_a_crash_recorded_before_the_stop_is_a_failure_whatever_the_time(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_failures=5, in_job_restarts=0)
    assert attempt(path, 0, stopped=True, failure_step=4, status=1, left=30.0) == 0
    assert [(r.reason, r.step) for r in ends(path)] == [("failure", 4)]
    # The same step again: the crash guard applies to crashes the other ranks were stopped after.
    assert attempt(path, 1, stopped=True, failure_step=4, status=1, left=30.0) == 1
    assert "step 4 twice" in str(ends(path)[-1].message)


def test_a_failure_recorded_after_the_stop_does_not_turn_a_preemption_into_one(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    attempt(
        path,
        0,
        stopped=True,
        failure_step=4,
        status=1,
        preempt="2026-11-22T01:00:00",
        crashed_before_stop=False,
    )
    assert ends(path)[-1].reason == "preemption"


def bad_node_attempt(path: Path, restart: int, bad: dict[str, str], total: int | None = 3) -> int:
    env = {
        **ENV,
        "SLURM_RESTART_COUNT": str(restart),
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_JOB_NUM_NODES": "2",
    }
    assert attempts.begin(path, env, now=1000.0 + restart) == 0
    Failure(None, 0, "preflight failed", AttemptId("77", restart), 1.0, bad_hosts=bad, retry=False).write(
        path
    )
    return attempts.end(
        path, 1, env, now=1001.0 + restart, preempt_time=lambda job: None, partition_nodes=lambda part: total
    )


def test_a_bad_node_is_left_out_of_the_requeued_job(tmp_path: Path, slurm_commands: list[list[str]]) -> None:
    path = run_dir(tmp_path, max_failures=3)
    assert bad_node_attempt(path, 0, {"node2": "preflight: node2 is slow"}) == 0
    (record,) = ends(path)
    assert record.requeue is True and "leaving out node2" in record.message
    assert Exclusions.read(path).hosts == {"node2": Exclusion("preflight: node2 is slow", 0, 1001.0)}
    # Asked whether a node went down (the accounting's events, sinfo); then held while its
    # excluded nodes change, so it cannot start on node2 in between.
    assert [command[0] for command in slurm_commands[:2]] == ["sacctmgr", "sinfo"]
    assert slurm_commands[2:] == [
        ["scontrol", "requeuehold", "77"],
        ["scontrol", "update", "JobId=77", "ExcNodeList=node2"],
        ["scontrol", "release", "77"],
    ]


def test_leaving_out_is_capped_so_the_job_can_still_start(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """3 nodes in the partition, a 2-node job: one node can be left out, not two."""
    path = run_dir(tmp_path, "  nodes: 2\n", max_failures=5)
    assert bad_node_attempt(path, 0, {"node2": "hung"}) == 0
    assert bad_node_attempt(path, 1, {"node3": "hung"}) == 1
    last = ends(path)[-1]
    assert last.requeue is False and "would leave 1 of partition debug's 3 nodes for a job of 2" in str(
        last.message
    )
    assert list(Exclusions.read(path).hosts) == ["node2"]


def test_a_preflight_failure_without_a_named_node_is_still_final(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_failures=3)
    assert bad_node_attempt(path, 0, {}) == 1
    assert ends(path)[-1].message == "preflight failed: not retrying"


def test_a_node_the_job_names_in_its_nodelist_is_not_left_out(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "resources:\n  time: 00:10:00\n  sbatch: {nodelist: 'node[1-2]'}\nrequeue: {max_failures: 3}\n"
    )
    assert bad_node_attempt(tmp_path, 0, {"node2": "preflight failed"}) == 1
    message = str(ends(tmp_path)[-1].message)
    assert message == (
        "preflight failed: the job's resources.sbatch.nodelist names node2, so it cannot run without it: "
        "not retrying"
    )


def test_a_refusal_not_to_retry_is_final_whatever_the_budget(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_failures=3)
    assert attempts.begin(path, ENV, now=1000.0) == 0
    Failure(None, 0, "refusing to unpickle the job X", AttemptId("77", 0), 1.0, retry=False).write(path)
    attempts.end(path, 1, ENV, now=1001.0, preempt_time=lambda job: None, time_left=lambda job: 60.0)
    (last,) = ends(path)
    assert (last.reason, last.requeue, last.final) == ("failure", False, True)
    assert last.message == "refusing to unpickle the job X: not retrying"


def test_a_node_that_went_down_under_a_killed_attempt_is_left_out(tmp_path: Path) -> None:
    """Slurm ends a job whose node failed NODE_FAIL and requeues it itself: the next attempt's
    begin finds the node in the accounting's events and leaves it out."""
    path = run_dir(tmp_path)
    asked: list[tuple[list[str], float]] = []

    def failed(nodes: list[str], since: float) -> dict[str, str]:
        asked.append((nodes, since))
        return {"node2": "DOWN: Not responding"}

    assert attempts.begin(path, ENV, now=1000.0, failed_nodes=failed, partition_nodes=lambda p: 3) == 0
    # Killed with its node: no end record; the requeued job starts elsewhere.
    env = {**ENV, "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node[1,3]"}
    assert attempts.begin(path, env, now=1100.0, failed_nodes=failed, partition_nodes=lambda p: 3) == 0
    assert asked == [(["node1", "node2"], 1000.0)]
    assert Exclusions.read(path).hosts["node2"].reason == "went down under attempt 1 (DOWN: Not responding)"
    assert [r.reason for r in ends(path)] == ["killed"]


def test_nodes_are_not_asked_about_after_an_attempt_that_ended_well(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    attempt(path, 0, stopped=True, preempt="2026-11-23T05:00:00")
    asked: list[list[str]] = []
    env = {**ENV, "SLURM_RESTART_COUNT": "1"}
    attempts.begin(path, env, now=1100.0, failed_nodes=lambda nodes, since: asked.append(nodes) or {})
    assert asked == [] and Exclusions.read(path).hosts == {}


def test_a_node_that_went_down_under_the_attempt_explains_its_end(tmp_path: Path) -> None:
    """The ranks on the other nodes were ended early: no crash of theirs, a node failure."""
    path = run_dir(tmp_path)
    assert attempts.begin(path, ENV, now=time.time() - 30, failed_nodes=lambda nodes, since: {}) == 0
    now = time.time()
    stop(path, 8, signal_at=now - 1)
    attempts.end(
        path,
        0,
        ENV,
        now=now,
        preempt_time=lambda job: None,
        time_left=lambda job: 500.0,
        partition_nodes=lambda p: 3,
        failed_nodes=lambda nodes, since: {"node2": "DOWN: Not responding"},
    )
    (record,) = ends(path)
    assert record.reason == "failure" and record.requeue is True
    assert "node2 went down under attempt 1 (DOWN: Not responding)" in record.message
    assert "srun ending" not in record.message
    assert list(Exclusions.read(path).hosts) == ["node2"]


def test_the_policy_reads_the_runs_sections_through_the_schema(tmp_path: Path) -> None:
    settings = outcome.Settings.of_run(run_dir(tmp_path, max_failures=5))
    defaults = Requeue()
    assert (settings.budget("failure"), settings.budget("timeout")) == (5, defaults.max_timeouts)
    assert settings.requeue.signal_lead_s == defaults.signal_lead_s
    # Only its own sections: another section's checks (a tracker this Python lacks) are the ranks'.
    (tmp_path / "config.yaml").write_text("requeue: {max_failures: -2}\ntrackers: {mlflow: true}\n")
    with pytest.raises(ConfigError, match=r"config.yaml: requeue: requeue.max_failures: must be >= -1"):
        outcome.Settings.of_run(tmp_path)


def crashed(
    path: Path,
    restart: int,
    in_job: int = 0,
    step: int | None = None,
    *,
    status: int = 1,
    progress: int | None = None,
    base: dict[str, str] = ENV,
    down: dict[str, str] | None = None,
    **failure: Any,
) -> int:
    """One attempt whose rank 1 recorded `failure` (none: nothing recorded) at `step`, having
    written `progress`, with the nodes Slurm saw go `down` under it; the batch script's status."""
    env = {**base, "SLURM_RESTART_COUNT": str(restart), IN_JOB_RESTART_ENV: str(in_job)}
    me = AttemptId("77", restart, in_job)
    assert attempts.begin(path, env, now=1000.0, failed_nodes=lambda n, t: {}) == 0
    if progress is not None:
        Progress(progress, me, time.time()).write(path)
    if failure:
        Failure(step, 1, failure.pop("error", "x"), me, time.time(), **failure).write(path)
    return attempts.end(
        path,
        status,
        env,
        now=1001.0,
        preempt_time=lambda j: None,
        time_left=lambda j: 500.0,
        partition_nodes=lambda p: 4,
        failed_nodes=lambda n, t: {h: why for h, why in (down or {}).items() if h in n},
    )


def raised(exception: str, line: int = 12) -> dict[str, Any]:
    """What a rank's crash record holds of a Python exception raised at train.py:`line`."""
    return {"exception": exception, "where": CodeSite("/src/train.py", line, "train")}


def test_only_restarts_without_progress_use_up_the_allocations_restarts(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """Crashes before any step, each of another kind: two restarts in the allocation, then the
    queue, where the count goes on, so the requeue budget is all that is left."""
    path = run_dir(tmp_path, max_failures=1, in_job_restarts=2)
    # (requeue, in-job restart, what the rank raised) -> batch script status, scontrol requeues so far
    expected = [
        ((0, 0, "NameError"), EXIT_RESTART_IN_JOB, 0),
        ((0, 1, "KeyError"), EXIT_RESTART_IN_JOB, 0),
        ((0, 2, "TypeError"), 0, 1),  # the restarts without progress used up: the queue
        ((1, 0, "ValueError"), 1, 1),  # no step gained in the new allocation either: budget spent
    ]
    for (restart, in_job, exception), status, requeues in expected:
        assert crashed(path, restart, in_job, **raised(exception)) == status, (restart, in_job)
        assert len(requeues_in(slurm_commands)) == requeues
    assert [r.in_job for r in ends(path)] == [True, True, False, False]
    assert "restart 2 of 2 in this allocation" in ends(path)[1].message
    assert "failure budget spent (1 requeues of 1 allowed)" in ends(path)[-1].message
    begun = [b.attempt_id for b in records.begins(records.read_attempts(path))]
    assert [(a.restart_count, a.in_job_restart) for a in begun] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_a_run_that_gets_further_between_crashes_keeps_its_allocation(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """Flaky hardware: a rank killed every 40 s, each attempt further than the last. Before, the
    fourth crash went through the queue."""
    path = run_dir(tmp_path, in_job_restarts=3)
    for in_job, step in enumerate([120, 250, 370, 500, 610, 740]):
        assert crashed(path, 0, in_job, step, error="rank 3 ended without a word") == EXIT_RESTART_IN_JOB
        assert "restart 1 of 3 in this allocation" in ends(path)[-1].message
    assert requeues_in(slurm_commands) == []
    # A crash that gains nothing counts, and the next step gained starts the count again.
    assert crashed(path, 0, 6, 700, error="rank 1 ended without a word") == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 7, 690, **raised("OSError")) == EXIT_RESTART_IN_JOB
    assert "restart 3 of 3" in ends(path)[-1].message
    assert crashed(path, 0, 8, 800, **raised("OSError")) == EXIT_RESTART_IN_JOB
    assert "restart 1 of 3" in ends(path)[-1].message


def test_the_same_crash_before_any_step_twice_stops_at_once(tmp_path: Path) -> None:
    """A NameError in the function's setup: no step to compare, so it is told by what it was."""
    path = run_dir(tmp_path)
    assert crashed(path, 0, 0, **raised("NameError")) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 1, **raised("NameError")) == 1
    (first, last) = ends(path)
    assert first.signature == last.signature == "NameError at /src/train.py:12"
    assert last.final and last.message == (
        "the same failure twice in a row (NameError at /src/train.py:12): not retrying"
    )


def test_the_same_failure_stops_across_a_requeue(tmp_path: Path, slurm_commands: list[list[str]]) -> None:
    path = run_dir(tmp_path, in_job_restarts=0)
    assert crashed(path, 0, **raised("NameError")) == 0
    assert crashed(path, 1, **raised("NameError")) == 1
    assert "the same failure twice in a row" in ends(path)[-1].message
    assert requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]]


def test_another_line_or_exception_is_another_failure(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    assert crashed(path, 0, 0, **raised("NameError", line=12)) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 1, **raised("NameError", line=30)) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 2, **raised("KeyError", line=30)) == EXIT_RESTART_IN_JOB
    assert not any(end.final for end in ends(path))


def test_the_same_exception_is_retried_when_a_step_was_gained_between(tmp_path: Path) -> None:
    """A flaky file system's OSError from the same line at steps 40 and 90: not the code's."""
    path = run_dir(tmp_path)
    assert crashed(path, 0, 0, 40, **raised("OSError")) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 1, 90, **raised("OSError")) == EXIT_RESTART_IN_JOB
    # At step 85, after 90 before: nothing gained since, and the same failure.
    assert crashed(path, 0, 2, 85, **raised("OSError")) == 1
    assert "the same failure twice in a row (OSError at /src/train.py:12)" in ends(path)[-1].message


def test_a_script_that_exits_at_once_with_the_same_status_twice_stops(tmp_path: Path) -> None:
    """argparse exits 2 before any step: each rank records the script's status (job/script/scriptrank.py)."""
    path = run_dir(tmp_path)
    error = "python train.py --lr 0.1 exited with status 2"
    assert crashed(path, 0, 0, error=error, exit_status=2) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 1, error=error, exit_status=2) == 1
    assert ends(path)[-1].message == (
        "the same failure twice in a row (the script exited with status 2 before any step): not retrying"
    )


def test_deaths_without_a_word_are_the_same_only_before_any_step(tmp_path: Path) -> None:
    """Killed ranks say nothing of the code: after steps, only the same step stops the run."""
    died = {"error": "rank 1 on node2 ended without a word"}
    path = run_dir(tmp_path)
    assert crashed(path, 0, 0, 30, **died) == EXIT_RESTART_IN_JOB
    assert crashed(path, 0, 1, 25, **died) == EXIT_RESTART_IN_JOB
    assert ends(path)[-1].signature == "a rank ended without a word at step 25"
    (tmp_path / "before").mkdir()
    before = run_dir(tmp_path / "before")
    assert crashed(before, 0, 0, **died) == EXIT_RESTART_IN_JOB
    assert crashed(before, 0, 1, **died) == 1
    assert "(a rank ended without a word before any step)" in ends(before)[-1].message
    # Nothing recorded at all (a single rank killed, no peer to say so): srun's status is what is known.
    (tmp_path / "silent").mkdir()
    silent = run_dir(tmp_path / "silent")
    assert crashed(silent, 0, 0, status=137) == EXIT_RESTART_IN_JOB
    assert crashed(silent, 0, 1, status=139) == EXIT_RESTART_IN_JOB
    assert crashed(silent, 0, 2, status=139) == 1
    assert "(no rank's record (srun's status 139) before any step)" in ends(silent)[-1].message


def test_a_stop_between_two_failures_is_not_twice_in_a_row(tmp_path: Path) -> None:
    path = run_dir(tmp_path, in_job_restarts=0)
    assert crashed(path, 0, **raised("NameError")) == 0
    assert attempt(path, 1, stopped=True, left=30.0) == 0
    assert crashed(path, 2, **raised("NameError")) == 0
    assert [r.reason for r in ends(path)] == ["failure", "timeout", "failure"]


def test_a_crash_at_the_same_step_stops_across_in_job_restarts(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0, in_job=0, status=1, failure_step=7) == EXIT_RESTART_IN_JOB
    assert attempt(path, 0, in_job=1, status=1, failure_step=7) == 1
    assert "step 7 twice" in ends(path)[-1].message


def test_preemption_and_time_limit_leave_the_allocation(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0, stopped=True, preempt="2026-11-22T01:00:00") == 0
    assert attempt(path, 1, stopped=True, left=30.0) == 0
    assert [(r.reason, r.in_job) for r in ends(path)] == [("preemption", False), ("timeout", False)]
    assert requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]] * 2


def failed(path: Path, env: dict[str, str], now: float, partition_size: int = 3) -> int:
    """attempts.end after a failed attempt (srun's status 1) on a partition of `partition_size`
    nodes, none of which Slurm saw go down: the batch script's status."""
    return attempts.end(
        path,
        1,
        env,
        now=now,
        preempt_time=lambda j: None,
        partition_nodes=lambda p: partition_size,
        failed_nodes=lambda n, t: {},
    )


def preflight_names_node2(path: Path, env: dict[str, str], partition_size: int) -> int:
    """The end of attempt 0 after a preflight that found node2 slow; the batch script's status."""
    Failure(5, 1, "preflight failed", AttemptId("77", 0), time.time(), bad_hosts={"node2": "slow"}).write(
        path
    )
    return failed(path, env, 2.0, partition_size=partition_size)


def test_a_failure_that_leaves_a_node_out_goes_through_the_queue(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path)
    env = {**ENV, "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NUM_NODES": "2"}
    attempts.begin(path, env, now=1.0)
    assert preflight_names_node2(path, env, partition_size=3) == 0
    assert ends(path)[-1].in_job is False
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node2"] in slurm_commands


def test_the_records_of_one_in_job_restart_are_not_the_next_ones(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0, in_job=0, stopped=True, status=1, failure_step=4) == EXIT_RESTART_IN_JOB
    # The next step of the allocation ends well: the stop and the failure of the one before are stale.
    assert attempt(path, 0, in_job=1) == 0
    assert [r.reason for r in ends(path)] == ["failure", "completed"]


def test_zero_in_job_restarts_requeues_every_crash(tmp_path: Path, slurm_commands: list[list[str]]) -> None:
    path = run_dir(tmp_path, in_job_restarts=0)
    assert attempt(path, 0, status=1, failure_step=3) == 0
    assert ends(path)[-1].in_job is False and requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]]


SPARE = "  nodes: 2\n  tasks_per_node: 2\n  spare_nodes: 1\n"
SPARE_ENV = {
    **ENV,
    "SLURM_JOB_NODELIST": "node[1-3]",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_NUM_NODES": "3",
}


def begin_spare(
    path: Path, in_job: int, capsys: pytest.CaptureFixture[str], restart: int = 0
) -> dict[str, str]:
    """`attempts begin` of a run with a spare node: the exports it prints for srun, parsed."""
    env = {**SPARE_ENV, IN_JOB_RESTART_ENV: str(in_job), "SLURM_RESTART_COUNT": str(restart)}
    assert attempts.begin(path, env, now=1000.0 + in_job, failed_nodes=lambda n, t: {}) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("export ")
    return dict(word.split("=", 1) for word in shlex.split(out.removeprefix("export ")))


def test_a_spare_node_takes_the_place_of_a_drained_one_inside_the_allocation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, SPARE)
    first = begin_spare(path, 0, capsys)
    assert Path(first["SLURM_HOSTFILE"]).read_text() == "node1\nnode1\nnode2\nnode2\n"
    assert (first["SLURM_NNODES"], first["SLURM_NTASKS"]) == ("2", "4")
    assert records.begins(records.read_attempts(path))[-1].nodes == "node1,node2"
    # node2's ranks die and an admin drains it: the next step trains on node1 and the spare.
    Failure(40, 0, "gloo: connection closed", AttemptId("77", 0), time.time()).write(path)
    status = attempts.end(
        path,
        1,
        SPARE_ENV,
        now=1001.0,
        preempt_time=lambda j: None,
        partition_nodes=lambda p: 3,
        failed_nodes=lambda nodes, since: {"node2": "DRAINED: bad cable"} if "node2" in nodes else {},
    )
    assert status == EXIT_RESTART_IN_JOB
    ended = ends(path)[-1]
    assert ended.in_job and "leaving out node2" in ended.message and "on node3 instead" in ended.message
    assert set(Exclusions.read(path).hosts) == {"node2"}
    second = begin_spare(path, 1, capsys)
    assert Path(second["SLURM_HOSTFILE"]).read_text() == "node1\nnode1\nnode3\nnode3\n"
    assert second["SLURM_HOSTFILE"] != first["SLURM_HOSTFILE"]
    assert requeues_in(slurm_commands) == []


SUSPECTED = "its 2 ranks died together while the other nodes' ran on"


def node2_killed(path: Path, env: dict[str, str]) -> int:
    """The end of attempt 0 after node2's two ranks died without a word (job/process/peerwatch.py)."""
    Progress(33, AttemptId("77", 0), time.time()).write(path)
    suspected = {"node2": SUSPECTED}
    Failure(None, 2, "rank 2 on node2, rank 3 on node2 ended without a word", AttemptId("77", 0), 1.0).write(
        path
    )
    failure = Failure.read_all(path)[-1]
    Failure(**{**vars(failure), "suspect_hosts": suspected}).write(path, replace=True)
    return failed(path, env, 1001.0)


def test_a_node_whose_ranks_all_died_is_swapped_for_a_spare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, SPARE)
    begin_spare(path, 0, capsys)
    assert node2_killed(path, SPARE_ENV) == EXIT_RESTART_IN_JOB
    ended = ends(path)[-1]
    assert ended.step == 33  # no step of its own: the step the attempt reached
    assert "node2: its 2 ranks died together" in ended.message and "on node3 instead" in ended.message
    assert "leaving out node2 for this allocation;" in ended.message
    excluded = Exclusions.read(path)
    assert excluded.hosts == {}
    assert excluded.set_aside == {"node2": Exclusion(SUSPECTED, 0, 1001.0, "77.0")}
    assert Path(begin_spare(path, 1, capsys)["SLURM_HOSTFILE"]).read_text() == "node1\nnode1\nnode3\nnode3\n"
    assert requeues_in(slurm_commands) == []


def test_a_suspect_is_left_out_of_its_allocation_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    """Its ranks' deaths are no proof: the requeue does not exclude it, and the next allocation
    trains on it again."""
    path = run_dir(tmp_path, SPARE, in_job_restarts=1)
    begin_spare(path, 0, capsys)
    assert node2_killed(path, SPARE_ENV) == EXIT_RESTART_IN_JOB
    begin_spare(path, 1, capsys)
    # The restart on the spare fails too, with no step gained: through the queue.
    Failure(None, 1, "OSError()", AttemptId("77", 0, 1), time.time(), exception="OSError").write(path)
    status = failed(path, {**SPARE_ENV, IN_JOB_RESTART_ENV: "1"}, 1002.0)
    assert status == 0 and not ends(path)[-1].in_job and ends(path)[-1].requeue
    assert requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]]
    assert not any("ExcNodeList" in word for command in slurm_commands for word in command)
    requeued = begin_spare(path, 0, capsys, restart=1)
    assert Path(requeued["SLURM_HOSTFILE"]).read_text() == "node1\nnode1\nnode2\nnode2\n"


def test_too_few_nodes_for_a_step_requeues_without_the_hosts_left_out_for_good_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, SPARE)
    excluded = Exclusions().adding({"node3": "went down"}, 0, 1.0)
    excluded.setting_aside({"node2": SUSPECTED}, 0, 1.0, "77.0").write(path)
    env = {**SPARE_ENV, IN_JOB_RESTART_ENV: "1"}
    assert attempts.begin(path, env, now=2.0, failed_nodes=lambda n, t: {}) == EXIT_FINISHED
    assert "requeueing 77 without node3\n" in capsys.readouterr().err
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node3"] in slurm_commands


def hung(path: Path, env: dict[str, str]) -> int:
    """The end of attempt 0 after the watchdog blamed rank 2 on node2 for a hang at step 7."""
    cause = "hung at step 7: rank 2 on node2 (in data.py:3 in get) did not arrive"
    me = AttemptId("77", 0)
    Failure(
        7, 0, f"hang: {cause}", me, 1.0, cause=cause, hang_dir="hangs/77.0", suspect_hosts={"node2": cause}
    ).write(path)
    return failed(path, env, 1001.0)


def test_a_hangs_culprit_is_set_aside_for_a_spare_and_else_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    """A rank that did not arrive is as likely a deadlocked data pipeline as a broken node."""
    (tmp_path / "spare").mkdir()
    spare = run_dir(tmp_path / "spare", SPARE)
    begin_spare(spare, 0, capsys)
    assert hung(spare, SPARE_ENV) == EXIT_RESTART_IN_JOB
    assert ends(spare)[-1].message == (
        "failure at step 7 (hung at step 7: rank 2 on node2 (in data.py:3 in get) did not arrive); "
        "leaving out node2 for this allocation; restart 1 of 3 in this allocation on node3 instead"
    )
    assert set(Exclusions.read(spare).set_aside) == {"node2"} and Exclusions.read(spare).hosts == {}
    (tmp_path / "none").mkdir()
    none = run_dir(tmp_path / "none", "  nodes: 2\n  tasks_per_node: 2\n")
    assert attempts.begin(none, ENV, now=1000.0, failed_nodes=lambda n, t: {}) == 0
    assert hung(none, ENV) == EXIT_RESTART_IN_JOB
    assert "leaving out" not in ends(none)[-1].message and ends(none)[-1].in_job
    assert Exclusions.read(none) == Exclusions() and slurm_commands == []


def test_without_a_spare_a_suspected_node_is_kept_and_the_step_restarts_on_the_same_nodes(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """A suspicion is no proof: the queue (with the node left out) costs more than one more try."""
    path = run_dir(tmp_path, "  nodes: 2\n  tasks_per_node: 2\n")
    env = {**ENV, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_PARTITION": "debug"}
    assert attempts.begin(path, env, now=1000.0, failed_nodes=lambda n, t: {}) == 0
    assert node2_killed(path, env) == EXIT_RESTART_IN_JOB
    assert "leaving out" not in ends(path)[-1].message
    assert Exclusions.read(path).hosts == {} and slurm_commands == []


def test_with_no_spare_left_a_bad_node_goes_through_the_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, SPARE)
    Exclusions.read(path).adding({"node3": "went down before"}, 0, 1.0).write(path)
    assert begin_spare(path, 0, capsys)["SLURM_HOSTFILE"]
    assert preflight_names_node2(path, SPARE_ENV, partition_size=8) == 0
    assert not ends(path)[-1].in_job
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node2,node3"] in slurm_commands


def test_too_few_good_nodes_for_a_step_sends_the_job_back_to_the_queue_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, SPARE)
    Exclusions.read(path).adding({"node1": "x", "node3": "y"}, 0, 1.0).write(path)
    assert attempts.begin(path, SPARE_ENV, now=1.0, failed_nodes=lambda n, t: {}) == EXIT_FINISHED
    assert "too few good nodes left in allocation node[1-3]" in capsys.readouterr().err
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node1,node3"] in slurm_commands
    assert records.begins(records.read_attempts(path)) == []


def test_a_node_found_down_only_at_the_restarts_begin_sends_the_job_back_to_the_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm_commands: list[list[str]]
) -> None:
    """The end of the attempt saw no node down (Slurm's view lagged) and chose a restart in the
    allocation; its begin finds node2 down: a step there would start on it."""
    path = run_dir(tmp_path, "  nodes: 2\n")
    env = {**ENV, "SLURM_JOB_PARTITION": "debug"}
    assert attempts.begin(path, env, now=1000.0) == 0
    Progress(8, AttemptId("77", 0), time.time()).write(path)
    assert (
        attempts.end(path, 1, env, now=1001.0, preempt_time=lambda j: None, failed_nodes=lambda n, t: {}) == 4
    )
    down = {"node2": "DOWN: slurmddp test"}
    again = {**env, IN_JOB_RESTART_ENV: "1"}
    status = attempts.begin(
        path, again, now=1002.0, failed_nodes=lambda n, t: down, partition_nodes=lambda p: 3
    )
    assert status == EXIT_FINISHED
    assert "node2 went down; requeueing 77 without node2" in capsys.readouterr().err
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node2"] in slurm_commands
    assert len(records.begins(records.read_attempts(path))) == 1


def test_an_attempt_that_died_before_its_first_step_did_not_crash_at_the_step_before(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0, status=1, failure_step=8) == EXIT_RESTART_IN_JOB
    # The next one dies without a crash record or a step of its own: progress.json is the last one's.
    Progress(8, AttemptId("77", 0), time.time()).write(path)
    assert attempt(path, 0, in_job=1, status=1) == EXIT_RESTART_IN_JOB
    assert "twice" not in ends(path)[-1].message


def test_the_same_death_on_the_spare_that_replaced_a_suspect_is_the_codes(tmp_path: Path) -> None:
    path = run_dir(tmp_path, SPARE)

    def died(host: str) -> dict[str, Any]:
        error = f"rank 2 on {host}, rank 3 on {host} ended without a word"
        return {"error": error, "suspect_hosts": {host: "its 2 ranks died together"}}

    assert crashed(path, 0, 0, base=SPARE_ENV, **died("node2")) == EXIT_RESTART_IN_JOB
    assert "on node3 instead" in ends(path)[-1].message
    assert crashed(path, 0, 1, base=SPARE_ENV, **died("node3")) == 1
    assert records.begins(records.read_attempts(path))[-1].nodes == "node1,node3"
    assert ends(path)[-1].message == (
        "the same failure twice in a row (a rank ended without a word before any step): not retrying"
    )
    assert Exclusions.read(path).hosts == {} and list(Exclusions.read(path).set_aside) == ["node2"]


def test_the_same_exception_after_leaving_a_node_out_is_the_codes(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """The words of a GPU fault in the error blame the node; the same error from the same line on
    another node does not."""
    path = run_dir(tmp_path, "  nodes: 2\n")
    env = {**ENV, "SLURM_JOB_PARTITION": "debug"}
    fault = raised("RuntimeError", line=40)
    assert crashed(path, 0, base=env, bad_hosts={"node2": "uncorrectable ECC error"}, **fault) == 0
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=node2"] in slurm_commands
    again = {**env, "SLURM_JOB_NODELIST": "node[1,3]"}
    assert crashed(path, 1, base=again, bad_hosts={"node3": "uncorrectable ECC error"}, **fault) == 1
    assert "the same failure twice in a row (RuntimeError at /src/train.py:40)" in ends(path)[-1].message


def test_nodes_slurm_saw_go_down_explain_the_same_death_again(tmp_path: Path) -> None:
    path = run_dir(tmp_path, "  nodes: 2\n")
    env = {**ENV, "SLURM_JOB_PARTITION": "debug"}
    died = {"error": "rank 1 ended without a word"}
    assert crashed(path, 0, base=env, down={"node2": "DOWN: Not responding"}, **died) == 0
    again = {**env, "SLURM_JOB_NODELIST": "node[1,3]"}
    assert crashed(path, 1, base=again, down={"node3": "DOWN: Not responding"}, **died) == 0
    assert "leaving out node3" in ends(path)[-1].message
    assert list(Exclusions.read(path).hosts) == ["node2", "node3"]


def test_a_rank_ended_by_the_stop_signal_itself_is_a_stop(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """srun's status 140, 128 + SIGUSR2: the time-limit signal reached a rank still starting,
    before its handler, so no rank recorded the stop (seen on the lab's 22.05)."""
    path = run_dir(tmp_path)
    Progress(40, AttemptId("77", 0), time.time()).write(path)
    assert attempt(path, 1, status=140, left=30.0) == 0
    (timed_out,) = ends(path)
    assert (timed_out.reason, timed_out.step, timed_out.in_job) == ("timeout", 40, False)
    # With a stop recorded after rank 0 heard that rank end without a word: a stop all the same.
    assert attempt(path, 2, status=140, stopped=True, failure_step=30, left=30.0) == 0
    assert ends(path)[-1].reason == "timeout"
    # Far from the time limit, not preempted: from outside slurmddp, as a local run counts it.
    assert attempt(path, 3, status=140, left=500.0) == 0
    assert ends(path)[-1].reason == "preemption"
    assert "SIGUSR2 ended a rank with 500 s of the time limit left" in ends(path)[-1].message
    assert requeues_in(slurm_commands) == [["scontrol", "requeue", "77"]] * 3
    # SIGTERM is srun's own after a crash (--kill-on-bad-exit): its status says nothing.
    assert attempt(path, 4, status=128 + 15, left=30.0) == EXIT_RESTART_IN_JOB
    assert ends(path)[-1].reason == "failure"


def test_the_stop_signals_status_is_the_configured_signals(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("resources: {time: '00:10:00'}\nrequeue: {signal: USR1}\n")
    assert attempt(tmp_path, 0, status=128 + 12, left=30.0) == EXIT_RESTART_IN_JOB
    assert attempt(tmp_path, 1, status=128 + 10, left=30.0) == 0
    assert [r.reason for r in ends(tmp_path)] == ["failure", "timeout"]


def test_the_end_record_keeps_the_phases_its_attempt_recorded(tmp_path: Path) -> None:
    """Where the attempt's time went (its rank 0's progress.json) goes into its end record, from
    which `status` works out the run's goodput; another attempt's progress is not taken."""
    path = run_dir(tmp_path)
    me = AttemptId("77", 0)
    Progress(150, me, 44.0, None, started_step=0, first_step_at=14.0, save_s=2.5).write(path)
    assert Progress.read(path) == Progress(150, me, 44.0, None, 0, 14.0, 2.5)
    attempt(path, 0, failure_step=150, status=1)
    (ended,) = ends(path)
    assert ended.phases == records.Phases(0, 14.0, 44.0, 2.5)
    Progress(150, me, 44.0, None, started_step=0, first_step_at=14.0).write(path)  # attempt 1's, not 2's
    attempt(path, 1, failure_step=160, status=1)
    assert ends(path)[1].phases is None
