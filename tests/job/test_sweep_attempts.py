"""The records that cancel and resubmit leave in a sweep element's attempts.jsonl, as the batch
script's requeue decision reads them."""

from __future__ import annotations

from pathlib import Path

from slurmddp.defaults import EXIT_FINISHED
from slurmddp.job.allocation import attempts
from slurmddp.rundir import records
from slurmddp.rundir.records import CANCELLED, AttemptId, End, Failure, Resubmit, Stop

ENV = {
    "SLURM_JOB_ID": "91",
    "SLURM_RESTART_COUNT": "0",
    "SLURM_ARRAY_JOB_ID": "90",
    "SLURM_ARRAY_TASK_ID": "1",
}


def element(tmp_path: Path, **requeue: int) -> Path:
    lines = "".join(f"  {key}: {value}\n" for key, value in requeue.items())
    (tmp_path / "config.yaml").write_text(f"requeue:\n{lines or '  {}'}\n")
    return tmp_path


def test_a_cancelled_run_is_neither_requeued_nor_started_again(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    run = element(tmp_path)
    assert attempts.begin(run, ENV, now=1.0) == 0
    cancelled = End(CANCELLED, None, 1.5, requeue=False, final=True, message="cancelled by the user")
    records.append_attempt(run, cancelled)
    # Rank 0's stop path (or the batch script) after the user's cancel: no requeue, no record.
    Stop(5, "SIGTERM", None, AttemptId("91", 0), 1.8).write(run)
    assert attempts.end(run, 0, ENV, now=2.0, preempt_time=lambda job: None) == 1
    assert slurm_commands == [] and records.read_attempts(run)[-1] == cancelled
    assert attempts.begin(run, {**ENV, "SLURM_RESTART_COUNT": "1"}, now=3.0) == EXIT_FINISHED


def test_a_resubmitted_run_starts_again_with_fresh_budgets(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    run = element(tmp_path, max_failures=1, in_job_restarts=0)
    for restart in range(2):
        env = {**ENV, "SLURM_RESTART_COUNT": str(restart)}
        assert attempts.begin(run, env, now=10.0 * restart) == 0
        Failure(restart, 0, "crashed", AttemptId("91", restart), 10.0 * restart + 4).write(run)
        attempts.end(run, 1, env, now=10.0 * restart + 5, preempt_time=lambda job: None)
    final = records.final_end(records.read_attempts(run))
    assert final is not None and final.message.startswith("failure budget spent")
    records.append_attempt(run, Resubmit(30.0, ["resubmit", str(run)]))
    new = {**ENV, "SLURM_JOB_ID": "95", "SLURM_ARRAY_JOB_ID": "94", "SLURM_ARRAY_TASK_ID": "0"}
    assert attempts.begin(run, new, now=31.0) == 0
    Failure(7, 0, "crashed", AttemptId("95", 0), 31.5).write(run)
    attempts.end(run, 1, new, now=32.0, preempt_time=lambda job: None)
    last = records.read_attempts(run)[-1]
    assert isinstance(last, End) and last.requeue is True and "requeue 1 (budget 1)" in last.message
    assert slurm_commands[-1] == ["scontrol", "requeue", "94_0"]
