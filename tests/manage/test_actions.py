"""`interrupt` from the login node, with the Slurm commands replaced: it signals only a running job,
and records which reason the signal stands for under the ids the job's ranks see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.errors import EXIT_USER_ERROR, SlurmddpError
from slurmddp.manage import actions


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A submitted Slurm run (job 4242) whose experiment stops on SIGUSR1."""
    run = tmp_path / "run"
    run.mkdir()
    manifest = {"executor": "slurm", "job_id": "4242", "logs": str(run / "logs"), "world_size": 2}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "config.yaml").write_text("requeue:\n  signal: USR1\n")
    return run


@pytest.mark.parametrize(
    ("state", "said"),
    [(None, "no longer in the queue"), ("PENDING", "PENDING"), ("COMPLETING", "COMPLETING")],
)
def test_only_a_running_job_is_interrupted(
    run: Path, monkeypatch: pytest.MonkeyPatch, state: str | None, said: str
) -> None:
    monkeypatch.setattr(slurm, "queue_state", lambda job: state)
    monkeypatch.setattr(slurm, "signal", lambda job, name: pytest.fail("signalled a job that is not running"))
    with pytest.raises(
        SlurmddpError, match=f"job 4242 is {said}: only a running job can be interrupted"
    ) as info:
        actions.interrupt(str(run), "preemption")
    assert info.value.exit_code == EXIT_USER_ERROR
    assert not (run / "interrupt.json").exists()


def test_the_signal_is_recorded_under_the_ranks_own_ids(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(slurm, "queue_state", lambda job: "RUNNING")
    # An array task: its own job id (what SLURM_JOB_ID says in the ranks) differs from 4242's.
    monkeypatch.setattr(
        slurm, "job_fields", lambda job: {"JobId": "4250", "ArrayJobId": "4242", "Restarts": "3"}
    )
    monkeypatch.setattr(slurm, "signal", lambda job, name: sent.append((job, name)))
    said = actions.interrupt(str(run), "timeout")
    assert sent == [("4242", "USR1")]
    assert json.loads((run / "interrupt.json").read_text()) == {
        "reason": "timeout",
        "job_id": "4250",
        "restart_count": 3,
    }
    assert said.startswith("sent SIGUSR1 to the ranks of job 4242 as a timeout")


def test_a_job_that_just_ended_is_not_signalled(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "queue_state", lambda job: "RUNNING")
    monkeypatch.setattr(slurm, "job_fields", lambda job: {"JobId": "4242"})  # no Restarts
    monkeypatch.setattr(slurm, "signal", lambda job, name: pytest.fail("signalled a job that ended"))
    with pytest.raises(SlurmddpError, match="names no JobId and Restarts"):
        actions.interrupt(str(run), "preemption")
    assert not (run / "interrupt.json").exists()
