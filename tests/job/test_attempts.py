"""The requeue decision of the batch script: reasons, budgets, the same-step crash stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmddp.defaults import EXIT_FINISHED
from slurmddp.job import attempts

ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-2]"}


def run_dir(tmp_path: Path, **requeue: int) -> Path:
    lines = "".join(f"  {key}: {value}\n" for key, value in requeue.items())
    (tmp_path / "config.yaml").write_text(f"resources:\n  time: 00:10:00\nrequeue:\n{lines or '  {}'}\n")
    return tmp_path


def attempt(
    path: Path,
    restart: int,
    *,
    stop: bool = False,
    failure_step: int | None = None,
    status: int = 0,
    preempt: str | None = None,
) -> int:
    env = {**ENV, "SLURM_RESTART_COUNT": str(restart)}
    me = {"job_id": "77", "restart_count": restart}
    assert attempts.begin(path, env, now=1000.0 + restart) == 0
    if stop:
        (path / "stop.json").write_text(json.dumps({"step": 10 * (restart + 1), **me}))
    if failure_step is not None:
        (path / "failure.json").write_text(json.dumps({"step": failure_step, **me}))
    return attempts.end(path, status, env, now=1001.0 + restart, preempt_time=lambda job: preempt)


def ends(path: Path) -> list[dict[str, object]]:
    return [r for r in attempts.read_attempts(path) if r["event"] == "end"]


@pytest.fixture(autouse=True)
def no_real_slurm(slurm_commands: list[list[str]]) -> None:
    """The requeue decision's scontrol calls are recorded, never run, in every test here."""


def test_completed_is_final(tmp_path: Path, slurm_commands: list[list[str]]) -> None:
    path = run_dir(tmp_path)
    assert attempt(path, 0) == 0
    assert ends(path)[-1]["reason"] == "completed" and ends(path)[-1]["final"] is True
    assert slurm_commands == []
    assert attempts.begin(path, ENV, now=2000.0) == EXIT_FINISHED


def test_preemption_is_told_by_preempt_time_not_elapsed_time(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    path = run_dir(tmp_path, max_timeouts=1)
    attempt(path, 0, stop=True, preempt="2026-11-22T01:00:00")
    attempt(path, 1, stop=True, preempt="2026-11-22T01:01:00")
    attempt(path, 2, stop=True, preempt=None)
    reasons = [(r["reason"], r["requeue"], r["step"]) for r in ends(path)]
    assert reasons == [("preemption", True, 10), ("preemption", True, 20), ("timeout", True, 30)]
    assert slurm_commands == [["scontrol", "requeue", "77"]] * 3


def test_timeout_budget(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_timeouts=1)
    assert attempt(path, 0, stop=True) == 0
    assert attempt(path, 1, stop=True) == 1
    last = ends(path)[-1]
    assert last["requeue"] is False and "timeout budget spent" in str(last["message"])


def test_failure_budget_and_same_step(tmp_path: Path) -> None:
    path = run_dir(tmp_path, max_failures=5)
    assert attempt(path, 0, status=1, failure_step=7) == 0
    assert attempt(path, 1, status=1, failure_step=9) == 0
    assert attempt(path, 2, status=1, failure_step=9) == 1
    assert "step 9 twice" in str(ends(path)[-1]["message"])


def test_interrupt_names_the_reason(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    (path / "interrupt.json").write_text(
        json.dumps({"reason": "preemption", "job_id": "77", "restart_count": 0})
    )
    attempt(path, 0, stop=True, preempt=None)
    assert ends(path)[-1]["reason"] == "preemption"


def test_stale_records_of_an_earlier_attempt_are_ignored(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    (path / "stop.json").write_text(json.dumps({"step": 5, "job_id": "77", "restart_count": 0}))
    attempts.begin(path, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=1.0)
    assert (
        attempts.end(path, 0, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=2.0, preempt_time=lambda j: None) == 0
    )
    assert ends(path)[-1]["reason"] == "completed"


def test_a_killed_attempt_is_recorded_at_the_next_begin(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    attempts.begin(path, ENV, now=1.0)
    attempts.begin(path, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=2.0)
    assert [r["reason"] for r in ends(path)] == ["killed"]


def test_array_tasks_requeue_alone() -> None:
    env = {"SLURM_JOB_ID": "90", "SLURM_ARRAY_JOB_ID": "88", "SLURM_ARRAY_TASK_ID": "2"}
    assert attempts.requeue_target(env) == "88_2"
    assert attempts.requeue_target({"SLURM_JOB_ID": "90"}) == "90"


def test_the_batch_script_does_not_record_an_attempt_twice(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    """Rank 0 already recorded and requeued; the batch script's call only repeats the requeue."""
    path = run_dir(tmp_path)
    attempts.begin(path, ENV, now=1.0)
    (path / "stop.json").write_text(json.dumps({"step": 12, "job_id": "77", "restart_count": 0}))
    assert attempts.end(path, 0, ENV, now=2.0, preempt_time=lambda j: "2026-01-01T00:00:00") == 0
    assert attempts.end(path, 0, ENV, now=3.0, preempt_time=lambda j: None) == 0
    assert [(r["reason"], r["step"]) for r in ends(path)] == [("preemption", 12)]
    assert slurm_commands == [["scontrol", "requeue", "77"]] * 2


def test_a_run_whose_ranks_all_returned_is_completed_whatever_srun_says(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    # A time-limit signal landing while the finished ranks exit made srun report status 140.
    path = run_dir(tmp_path)
    assert attempts.begin(path, ENV, now=1000.0) == 0
    (path / "result.json").write_text(json.dumps({"job_id": "77", "restart_count": 0, "result": {}}))
    assert attempts.end(path, 140, ENV, now=1001.0, preempt_time=lambda job: None) == 0
    assert ends(path)[-1]["reason"] == "completed" and slurm_commands == []
    # A result left by an earlier attempt does not count.
    (tmp_path / "later").mkdir()
    later = run_dir(tmp_path / "later")
    (later / "result.json").write_text(json.dumps({"job_id": "77", "restart_count": 0}))
    assert attempt(later, 1, status=140) == 0
    assert ends(later)[-1]["reason"] == "failure"
