"""Ranks that never reached slurmddp (job/allocation/unstarted.py): the interpreter missing from the
image, or one without slurmddp. Their stderr, as srun wrote it to the run's logs, is read by the
batch script's `attempts end`; the attempt is a failure not to retry, quoting the line. The stderr
texts are those seen on the lab (runc 1.1, Slurm 22.05's slurmstepd, Python 3.11) and Apptainer's
documented one."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmddp.job.allocation import attempts, unstarted
from slurmddp.rundir import ranklogs, records
from slurmddp.rundir.records import AttemptId

ME = AttemptId("77", 0)
NO_MODULE = (
    "/usr/bin/python3: Error while finding module specification for 'slurmddp.job.launch.boot' "
    "(ModuleNotFoundError: No module named 'slurmddp')\n"
)
RUNC = (
    'time="2026-11-28T01:28:33Z" level=warning msg="cannot toggle freezer: cgroups not configured"\n'
    'time="2026-11-28T01:28:33Z" level=error msg="runc run failed: unable to start container process: '
    'exec: \\"/opt/missing/python\\": stat /opt/missing/python: no such file or directory"\n'
)
SLURMSTEPD = "slurmstepd-node1: error: execve(): /nonexist/python3: No such file or directory\n"
BAD_ROOT = (
    'time="2026-11-28T01:32:55Z" level=error msg="runc run failed: invalid rootfs: not an absolute path, '
    'or a symlink"\n'
)
APPTAINER = 'FATAL:   "python3": executable file not found in $PATH\n'
USERS_OWN = (
    "Traceback (most recent call last):\n"
    "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'\n"
    "ModuleNotFoundError: No module named 'slurmddp_plugins'\n"
)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (NO_MODULE, "has no slurmddp"),
        (RUNC, "interpreter is not where the job names it"),
        (SLURMSTEPD, "interpreter is not where the job names it"),
        (APPTAINER, "interpreter is not where the job names it"),
        (BAD_ROOT, "root filesystem cannot be used"),
    ],
)
def test_each_starters_words_make_a_failure_not_to_retry(text: str, named: str) -> None:
    failure = unstarted.failure({0: "", 2: text}, ME)
    assert failure is not None and failure.retry is False and failure.rank == 2
    assert named in failure.error and ("container.python" in failure.error or "root.path" in failure.error)
    assert text.strip().splitlines()[-1][-40:] in failure.error


def test_a_missing_slurmddp_is_named_before_the_missing_program_of_another_task() -> None:
    failure = unstarted.failure({0: SLURMSTEPD, 3: NO_MODULE}, ME)
    assert failure is not None and failure.rank == 3 and "has no slurmddp" in failure.error


def test_the_users_own_errors_are_not_taken_for_an_unstarted_rank() -> None:
    assert unstarted.failure({0: USERS_OWN, 1: ""}, ME) is None


def test_the_tails_are_this_jobs_tasks_only_and_their_ends(tmp_path: Path) -> None:
    (tmp_path / "77_0_log.err").write_text("x" * 10_000 + "the end")
    (tmp_path / "77_1_log.err").write_text("one")
    (tmp_path / "77_1_log.out").write_text("stdout")
    (tmp_path / "770_0_log.err").write_text("another job")
    (tmp_path / "77_3_0_log.err").write_text("an array's task")
    tails = ranklogs.stderr_tails(tmp_path, {"SLURM_JOB_ID": "77"})
    assert set(tails) == {0, 1} and tails[1] == "one"
    assert tails[0].endswith("the end") and len(tails[0]) == ranklogs.TAIL_BYTES
    array = ranklogs.stderr_tails(
        tmp_path, {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    )
    assert array == {0: "an array's task"}


ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-2]"}


def begun(tmp_path: Path) -> tuple[Path, Path]:
    """A run with a failure budget whose first attempt began; its run directory and logs folder."""
    run = tmp_path / "run"
    logs = run / "logs"
    logs.mkdir(parents=True)
    (run / "config.yaml").write_text("resources:\n  time: 00:10:00\nrequeue:\n  max_failures: 3\n")
    assert attempts.begin(run, ENV, now=1000.0) == 0
    return run, logs


def test_the_batch_scripts_end_of_an_attempt_whose_ranks_never_started_is_final(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    run, logs = begun(tmp_path)
    (logs / "77_0_log.err").write_text(NO_MODULE)
    (logs / "77_1_log.err").write_text("srun: error: node2: task 1: Killed\n")
    assert attempts.end(run, 1, ENV, 1001.0, lambda job: None, logs=logs) == 1
    (end,) = records.ends(records.read_attempts(run))
    assert end.reason == "failure" and end.final and not end.requeue
    assert "No module named 'slurmddp'" in end.message and end.message.endswith("not retrying")
    assert not [c for c in slurm_commands if c[:2] == ["scontrol", "requeue"]]


def test_without_those_words_the_same_end_goes_through_the_queue(
    tmp_path: Path, slurm_commands: list[list[str]]
) -> None:
    run, logs = begun(tmp_path)
    (logs / "77_0_log.err").write_text(USERS_OWN)
    attempts.end(run, 1, ENV, 1001.0, lambda job: None, time_left=lambda job: 600.0, logs=logs)
    (end,) = records.ends(records.read_attempts(run))
    assert end.reason == "failure" and end.requeue, end
