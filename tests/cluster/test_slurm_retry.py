"""Slurm's commands riding out a blip of slurmctld or slurmdbd: the package's runners and the
tests' own helpers (conftest's slurm_command and wait_for_job), each against fake commands on PATH
that fail the way Slurm does for their first calls and then answer."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import slurm_command, wait_for_job

from slurmddp.cluster import slurm
from slurmddp.errors import SlurmCommandError

pytestmark = pytest.mark.process  # every test runs the fake commands

TIMEOUT = "slurm_load_jobs error: Socket timed out on send/recv operation"
CONNECT_FAILURE = "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)"
DBD_RESTARTING = "sacct: error: Problem talking to the database: Connection refused"
GONE = "slurm_load_jobs error: Invalid job id specified"

# Records its arguments, fails its first FAILS calls saying ERROR, then prints OUT.
FAKE = """#!/bin/sh
dir=$(dirname "$0")
name=$(basename "$0")
echo "$*" >> "$dir/$name.calls"
if [ "$(wc -l < "$dir/$name.calls")" -le "$(cat "$dir/$name.fails")" ]; then
  cat "$dir/$name.error" >&2
  exit 1
fi
cat "$dir/$name.out"
"""


@dataclass(frozen=True)
class FakeSlurm:
    bin: Path

    def answer(self, tool: str, out: str = "", fails: int = 0, error: str = "") -> None:
        """`tool` fails its first `fails` calls saying `error`, then prints `out`."""
        script = self.bin / tool
        script.write_text(FAKE)
        script.chmod(0o755)
        (self.bin / f"{tool}.fails").write_text(str(fails))
        (self.bin / f"{tool}.error").write_text(error + "\n")
        (self.bin / f"{tool}.out").write_text(out)

    def calls(self, tool: str) -> list[str]:
        path = self.bin / f"{tool}.calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Fake Slurm commands first on PATH, and short pauses between tries."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "RETRY_FIRST_PAUSE_S", 0.01)
    return FakeSlurm(folder)


# ---- the package's runners ----


def test_squeue_rides_out_controller_timeouts(fake: FakeSlurm) -> None:
    fake.answer("squeue", "RUNNING\n", fails=2, error=TIMEOUT)
    assert slurm.queue_state("42") == "RUNNING"
    assert fake.calls("squeue") == ["-h -j 42 -o %T"] * 3


def test_a_job_gone_from_the_queue_is_an_answer_asked_once(fake: FakeSlurm) -> None:
    fake.answer("squeue", "RUNNING\n", fails=1, error=GONE)
    assert slurm.queue_state("42") is None
    assert len(fake.calls("squeue")) == 1


def test_sacct_rides_out_slurmdbd_restarting(fake: FakeSlurm) -> None:
    fake.answer("sacct", "7|COMPLETED\n", fails=2, error=DBD_RESTARTING)
    fake.answer("squeue", "", fails=1, error=GONE)
    assert slurm.job_states(["7"]) == {"7": "COMPLETED"}
    assert len(fake.calls("sacct")) == 3 and len(fake.calls("squeue")) == 1


def test_scontrol_rides_out_an_unreachable_controller(fake: FakeSlurm) -> None:
    fake.answer("scontrol", "MaxArraySize            = 1001\n", fails=1, error=CONNECT_FAILURE)
    assert slurm.show_config() == "MaxArraySize            = 1001\n"
    assert fake.calls("scontrol") == ["show config"] * 2


def test_a_real_error_fails_at_once(fake: FakeSlurm) -> None:
    fake.answer("scontrol", "JobId=42\n", fails=1, error="scontrol: error: Invalid job id specified")
    with pytest.raises(SlurmCommandError, match="Invalid job id specified"):
        slurm.job_fields("42")
    assert len(fake.calls("scontrol")) == 1


def test_a_blip_that_lasts_fails_once_the_patience_is_spent(
    fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "RETRY_S", 0.3)
    fake.answer("scontrol", fails=1000, error=CONNECT_FAILURE)
    started = time.monotonic()
    with pytest.raises(SlurmCommandError, match=r"connect failure"):
        slurm.show_config()
    assert time.monotonic() - started < 5
    assert len(fake.calls("scontrol")) > 1


def test_final_state_does_not_wait_out_the_blip_again_per_try(
    fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "RETRY_S", 0)
    fake.answer("sacct", fails=1000, error=DBD_RESTARTING)
    assert slurm.final_state("42") == "UNKNOWN"
    assert len(fake.calls("sacct")) == 1


@pytest.mark.parametrize(
    ("error", "tries"),
    [
        # slurmctld may have signalled the job already, its answer lost: a second signal is not the first.
        ("Socket timed out on send/recv operation", 1),
        ("Unable to contact slurm controller (connect failure)", 2),
    ],
)
def test_a_signal_is_sent_again_only_when_the_first_cannot_have_arrived(
    fake: FakeSlurm, error: str, tries: int
) -> None:
    fake.answer("scancel", fails=1, error=f"scancel: error: Kill job error on job id 42: {error}")
    if tries == 1:
        with pytest.raises(SlurmCommandError, match="Socket timed out"):
            slurm.signal("42", "USR2")
    else:
        slurm.signal("42", "USR2")
    assert fake.calls("scancel") == ["--signal=USR2 42"] * tries


def test_a_requeue_is_not_sent_again_after_a_timeout(fake: FakeSlurm) -> None:
    fake.answer("scontrol", fails=1, error="scontrol: error: Socket timed out on send/recv operation")
    assert slurm.requeue("42") == "scontrol: error: Socket timed out on send/recv operation"
    assert fake.calls("scontrol") == ["requeue 42"]


# ---- the tests' own helpers ----


def test_wait_for_job_rides_out_a_squeue_timeout(fake: FakeSlurm) -> None:
    fake.answer("squeue", "COMPLETED\n", fails=1, error=TIMEOUT)
    fake.answer("sacct", "COMPLETED\n", fails=1, error=DBD_RESTARTING)
    assert wait_for_job("42", dict(os.environ), timeout=10) == "COMPLETED"
    assert len(fake.calls("squeue")) == 2 and len(fake.calls("sacct")) == 2


def test_wait_for_job_fails_at_once_on_a_real_error(fake: FakeSlurm) -> None:
    fake.answer("squeue", "COMPLETED\n", fails=1, error="squeue: error: Invalid user: nobody")
    with pytest.raises(RuntimeError, match="Invalid user"):
        wait_for_job("42", dict(os.environ), timeout=10)
    assert len(fake.calls("squeue")) == 1


@pytest.mark.parametrize(
    ("error", "tries"),
    [
        # slurmctld may have queued the job, its answer lost: a second would be a second job.
        ("Socket timed out on send/recv operation", 1),
        ("Unable to contact slurm controller (connect failure)", 2),  # as sbatch said (22.05.8)
    ],
)
def test_a_test_submits_again_only_when_the_first_cannot_have_arrived(
    fake: FakeSlurm, error: str, tries: int
) -> None:
    said = f"sbatch: error: Batch job submission failed: {error}"
    fake.answer("sbatch", "Submitted batch job 43\n", fails=1, error=said)
    args = ["sbatch", "-p", "high", "--wrap", "sleep 3"]
    if tries == 1:
        with pytest.raises(RuntimeError, match="Socket timed out"):
            slurm_command(args, dict(os.environ), check=True)
    else:
        assert slurm_command(args, dict(os.environ), check=True).stdout == "Submitted batch job 43\n"
    assert len(fake.calls("sbatch")) == tries
