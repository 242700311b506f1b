"""requeue.resident_launcher without Slurm: the records a restart in the step leaves for the batch
script, and the task's own parts (the rank's status, what it leaves behind, the verdict)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmddp.defaults import EXIT_RESTART_IN_JOB, IN_JOB_RESTART_ENV
from slurmddp.errors import ConfigError
from slurmddp.experiment.load import load_experiment
from slurmddp.files import write_atomic
from slurmddp.job.allocation import attempts, stepwatch
from slurmddp.job.launch import resident
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Failure

ENV = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-2]"}


@pytest.fixture(autouse=True)
def no_real_slurm(slurm_commands: list[list[str]]) -> None:
    """The decision's scontrol calls are recorded, never run."""


def run_dir(tmp_path: Path, resources: str = "") -> Path:
    (tmp_path / "config.yaml").write_text(f"resources:\n  time: 00:10:00\n{resources}requeue: {{}}\n")
    return tmp_path


def crash_in_step(path: Path, in_job: int, step: int) -> int | None:
    """What task 0 of a resident step does after attempt `in_job` crashed at `step`: `end`, then
    `restart_in_place`; the next attempt's number, or None."""
    env = {**ENV, IN_JOB_RESTART_ENV: str(in_job)}
    Failure(step, 0, "", AttemptId("77", 0, in_job), time.time()).write(path)
    decided = attempts.end(
        path, 1, env, now=time.time(), preempt_time=lambda job: None, time_left=lambda job: 300.0
    )
    assert decided == EXIT_RESTART_IN_JOB
    return attempts.restart_in_place(path, env, time.time())


def attempt_ids(path: Path) -> list[tuple[str, int]]:
    return [
        (event.to_json()["event"], event.attempt_id.in_job_restart)  # type: ignore[union-attr]
        for event in records.read_attempts(path)
    ]


def test_restarts_in_the_step_are_counted_on_by_the_batch_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run_dir(tmp_path)
    assert attempts.begin(path, {**ENV, IN_JOB_RESTART_ENV: "0"}, now=1000.0) == 0
    assert crash_in_step(path, 0, step=10) == 1
    assert crash_in_step(path, 1, step=20) == 2
    assert capsys.readouterr().out == ""
    # The step ends for good (a third crash that the step does not take), and the batch script,
    # whose count still says 0, records it as attempt 2's and starts attempt 3.
    Failure(30, 0, "", AttemptId("77", 0, 2), time.time()).write(path)
    batch = {**ENV, IN_JOB_RESTART_ENV: "0"}
    assert attempts.end(path, 1, batch, time.time(), lambda job: None, time_left=lambda job: 300.0) == (
        EXIT_RESTART_IN_JOB
    )
    assert attempts.begin(path, {**ENV, IN_JOB_RESTART_ENV: "1"}, now=time.time()) == 0
    assert capsys.readouterr().out.strip() == f"export {IN_JOB_RESTART_ENV}=3"
    assert attempt_ids(path) == [
        ("begin", 0),
        ("end", 0),
        ("begin", 1),
        ("end", 1),
        ("begin", 2),
        ("end", 2),
        ("begin", 3),
    ]
    # The batch script's own end of attempt 3, with the count begin handed the step.
    assert attempts.end(path, 0, {**ENV, IN_JOB_RESTART_ENV: "3"}, time.time(), lambda job: None) == 0
    assert records.ends(records.read_attempts(path))[-1].attempt_id == AttemptId("77", 0, 3)


def test_with_spares_the_restart_is_left_to_the_batch_script(tmp_path: Path) -> None:
    path = run_dir(tmp_path, "  nodes: 1\n  spare_nodes: 1\n")
    env = {**ENV, IN_JOB_RESTART_ENV: "0"}
    assert attempts.begin(path, env, now=1000.0) == 0
    assert crash_in_step(path, 0, step=10) is None
    assert [event for event, _ in attempt_ids(path)] == ["begin", "end"]


def test_a_rank_killed_by_a_signal_reports_as_srun_would_and_its_workers_are_ended(tmp_path: Path) -> None:
    """A rank that leaves a forked worker behind and dies of SIGKILL: 128 + 9, and the worker,
    which came back to the task (a subreaper, as in `supervise`), is gone."""
    worker_pid = tmp_path / "worker"
    script = f"""
import ctypes, os, signal, sys, time
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from slurmddp.job.launch import resident
ctypes.CDLL(None).prctl(resident.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
def rank():
    worker = os.fork()
    if worker == 0:
        time.sleep(600)
        os._exit(0)
    open({str(worker_pid)!r}, "w").write(str(worker))
    os.kill(os.getpid(), signal.SIGKILL)
run = resident._run_child
print(run(rank, 0), run(lambda: sys.exit(3), 0), run(lambda: None, 0))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(128 + signal.SIGKILL), "3", "0"]
    pid = int(worker_pid.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_task_waits_for_the_verdict_and_takes_none_as_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resident, "VERDICT_WAIT_S", 0.2)
    assert resident._await_verdict(tmp_path) == resident.END
    (tmp_path / "verdict").write_text("2\n")
    assert resident._await_verdict(tmp_path) == "2"


def test_task_0_ends_the_step_when_a_task_never_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task whose node went silent: no decision is taken in the step, nothing is recorded."""
    monkeypatch.setattr(resident, "REPORT_WAIT_S", 0.2)
    path = run_dir(tmp_path)
    folder = path / "resident" / "77.0.0"
    folder.mkdir(parents=True)
    (folder / "task-0").write_text("137\n")
    env = {**ENV, IN_JOB_RESTART_ENV: "0"}
    assert resident._decide(path, path / "logs", folder, 2, env, AttemptId("77", 0, 0)) == resident.END
    assert records.read_attempts(path) == []


def test_the_step_watch_reads_the_failure_of_the_attempt_the_step_runs_now(tmp_path: Path) -> None:
    """The batch script started the step as attempt 0; the tasks restarted it as attempt 1, whose
    failure names a silent host: srun is ended all the same."""
    for n in (0, 1):
        records.append_attempt(
            tmp_path, records.Begin(n, 1000.0 + n, "node1", "node[1-2]", AttemptId("7", 0, n))
        )
    srun = subprocess.Popen(["sleep", "60"])
    said: list[str | None] = []
    watching = threading.Thread(
        target=lambda: said.append(stepwatch.watch(tmp_path, srun.pid, AttemptId("7", 0, 0), 0.02))
    )
    watching.start()
    Failure(
        5, 2, "node2 stopped answering", AttemptId("7", 0, 1), time.time(), bad_hosts={"node2": "x"}
    ).write(tmp_path)
    assert srun.wait(10) == -signal.SIGKILL
    watching.join(10)
    assert said and said[0] is not None and "node2" in said[0], said


def test_a_failure_that_names_a_bad_host_is_left_to_the_batch_script(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    attempt = AttemptId("77", 0, 0)
    assert attempts.begin(path, {**ENV, IN_JOB_RESTART_ENV: "0"}, now=1000.0) == 0
    Failure(5, 2, "node2 stopped answering", attempt, time.time(), bad_hosts={"node2": "x"}).write(path)
    folder = path / "resident" / "77.0.0"
    for task in (0, 1):
        write_atomic(folder / f"task-{task}", "137\n")
    env = {**ENV, IN_JOB_RESTART_ENV: "0"}
    assert resident._decide(path, path / "logs", folder, 2, env, attempt) == resident.END
    assert [event for event, _ in attempt_ids(path)] == ["begin"]


def test_mpi_ranks_cannot_be_forked_again(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("entrypoint: pkg.train:main\nrequeue:\n  resident_launcher: true\n")
    load_experiment(path, [])
    with pytest.raises(ConfigError, match=r"requeue.resident_launcher: .*dist.launcher: mpi"):
        load_experiment(path, ["dist.launcher=mpi"])


def test_a_rank_forked_after_torch_was_imported_takes_the_threads_it_is_told() -> None:
    """torch imported first, OMP_NUM_THREADS=1 set after: torch keeps its own count (the cores)
    until the rank sets it."""
    script = """
import os, sys, torch
sys.path.insert(0, sys.argv[1])
from slurmddp.job.launch.runtime import threads_as_told
os.environ["OMP_NUM_THREADS"] = "1"
before = torch.get_num_threads()
threads_as_told()
print(before, torch.get_num_threads())
"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    command = [sys.executable, "-c", script, str(Path(__file__).parents[2])]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert after == 1 and (before > 1 or os.cpu_count() == 1), proc.stdout


def test_a_task_waiting_for_the_verdict_leaves_at_once_on_sigterm(tmp_path: Path) -> None:
    """srun ends the step (a task died with its node): SIGTERM, then SIGKILL after KillWait. A
    task whose rank already ended goes with its rank's status at the SIGTERM."""
    script = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from slurmddp.job.launch import resident
env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}
resident.supervise(lambda: sys.exit(5), Path(sys.argv[2]), Path(sys.argv[2]), env, ("TERM",))
"""
    report = tmp_path / "resident" / "77.0.0" / "task-1"
    task = task_until(script, tmp_path, report)
    task.send_signal(signal.SIGTERM)
    assert task.wait(5) == 5
    assert report.read_text() == "5\n"


def test_a_task_signalled_while_its_rank_ran_leaves_with_the_rank_without_waiting(tmp_path: Path) -> None:
    """srun ends the step once a task was killed (its node's processes SIGKILLed): every process
    of the step gets SIGTERM while the ranks still run. The task leaves as its rank does, without
    a report or a wait for the tasks that died (task 0 waited 10 s for them before)."""
    script = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from slurmddp.job.launch import resident
def rank():
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(0.2)
    sys.exit(1)
env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}
resident.supervise(rank, Path(sys.argv[2]), Path(sys.argv[2]), env, ("TERM",))
"""
    command = [sys.executable, "-c", script, str(Path(__file__).parents[2]), str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    # A task reports (RUN_DIR/resident/...) before it waits: no report, no wait. Not timed: the
    # task's own start (torch imported) took 12 s once under the suite's load.
    assert not (tmp_path / "resident").exists(), "the task reported and waited for a verdict"


def test_a_stop_signal_to_the_task_reaches_its_rank(tmp_path: Path) -> None:
    """A container runtime hands Slurm's signals to the container's first process only (runc):
    the task. Its rank hears of the preemption all the same, and stops (here: exits 7)."""
    started = tmp_path / "started"
    script = f"""
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from slurmddp.job.launch import resident
from slurmddp.job.process import signals
def rank():
    open({str(started)!r}, "w").close()
    deadline = time.monotonic() + 30
    while signals.received() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(7 if signals.received() is not None else 1)
env = {{"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}}
resident.supervise(rank, Path(sys.argv[2]), Path(sys.argv[2]), env, ("USR2", "TERM"))
"""
    task = task_until(script, tmp_path, started)
    task.send_signal(signal.SIGUSR2)
    assert task.wait(20) == 7


def task_until(script: str, tmp_path: Path, there: Path) -> subprocess.Popen[bytes]:
    """`script` (argv: the repository, tmp_path) started as a task, once `there` exists."""
    task = subprocess.Popen([sys.executable, "-c", script, str(Path(__file__).parents[2]), str(tmp_path)])
    deadline = time.monotonic() + 60
    while not there.exists():
        assert time.monotonic() < deadline and task.poll() is None
        time.sleep(0.05)
    return task
