"""`interrupt` on a local run, with /proc and the signals faked: the ranks are the local
controller's tasks and nothing else, they are signalled only once all run with their stop-signal
handler, under the attempt id their records give; an ended run is refused, naming why."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from slurmddp.errors import EXIT_USER_ERROR, SlurmddpError
from slurmddp.manage import actions, backend, local_ranks, report, runs
from slurmddp.manage.local_ranks import Task
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, End

USR2, TERM = int(signal.SIGUSR2), int(signal.SIGTERM)
JOB = "4242"


def fake_process(
    proc: Path, pid: int, ppid: int, cmdline: list[str], environ: dict[str, str], caught: int = 0
) -> None:
    entry = proc / str(pid)
    entry.mkdir(parents=True)
    (entry / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in cmdline) + b"\0")
    (entry / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
    (entry / "status").write_text(f"Name:\tpython\nPPid:\t{ppid}\nSigCgt:\t{caught:016x}\n")


def test_the_ranks_are_the_controllers_tasks_and_nothing_else(tmp_path: Path) -> None:
    proc, logs, other = tmp_path / "proc", tmp_path / "run" / "logs", tmp_path / "other" / "logs"
    controller = ["python", "-m", "submitit.local._local", str(logs)]
    task = ["python", "-u", "-m", "slurmddp.job.launch.boot", "-u", "-m", "submitit.core._submit", str(logs)]
    env = {"SUBMITIT_LOCAL_JOB_ID": "100", "SUBMITIT_EXECUTOR": "local"}
    fake_process(proc, 100, 1, controller, {"SUBMITIT_LOCAL_NTASKS": "2"})
    fake_process(proc, 101, 100, task, {**env, "SUBMITIT_LOCAL_GLOBALID": "0"}, caught=1 << (USR2 - 1))
    fake_process(proc, 102, 100, task, {**env, "SUBMITIT_LOCAL_GLOBALID": "1"})
    # A DataLoader worker forked from rank 0: the same command line and environment.
    fake_process(proc, 103, 101, task, {**env, "SUBMITIT_LOCAL_GLOBALID": "0"})
    # Rank 0's script, with its stop-signal handler.
    fake_process(
        proc, 104, 101, ["python", "-m", "slurmddp.job.script.scriptrun", "train.py"], env, 1 << (TERM - 1)
    )
    # Another run's controller and task; a task of this controller for another folder.
    fake_process(proc, 200, 1, ["python", "-m", "submitit.local._local", str(other)], {})
    fake_process(proc, 201, 200, [*task[:-1], str(other)], {**env, "SUBMITIT_LOCAL_JOB_ID": "200"})
    fake_process(proc, 105, 100, [*task[:-1], str(other)], {**env, "SUBMITIT_LOCAL_GLOBALID": "2"})
    # A process that took the id of a controller long gone.
    fake_process(proc, 300, 1, ["sleep", "100"], {})

    found = local_ranks.tasks("100", logs, proc)
    assert [(t.pid, t.rank) for t in found] == [(101, 0), (102, 1)]
    assert USR2 in found[0].catches and USR2 not in found[1].catches
    # Rank 0's script, not rank 1's (not started yet).
    assert found[0].script_catches == frozenset({TERM}) and found[1].script_catches is None
    assert local_ranks.world_size("100", logs, proc) == 2
    assert local_ranks.tasks("300", logs, proc) == [] and local_ranks.world_size("300", logs, proc) is None
    assert local_ranks.tasks("100", other, proc) == []
    assert local_ranks.controller("4242", logs, proc) is None


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A local run (job 4242, 2 ranks) whose experiment stops on SIGUSR2, in its first attempt."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    manifest = {"executor": "local", "job_id": JOB, "logs": str(run / "logs"), "world_size": 2}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "config.yaml").write_text("requeue:\n  signal: USR2\n")
    records.append_attempt(run, Begin(0, time.time(), "laptop", "laptop", AttemptId(JOB, 0)))
    return run


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], int]]:
    signalled: list[tuple[list[int], int]] = []

    def send(pids: list[int], signum: int) -> list[int]:
        signalled.append((pids, signum))
        return pids

    monkeypatch.setattr(local_ranks, "send", send)
    return signalled


def test_a_running_local_run_is_signalled_under_its_attempts_id(
    run: Path, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[list[int], int]]
) -> None:
    monkeypatch.setattr(local_ranks, "world_size", lambda job, logs: 2)
    monkeypatch.setattr(
        local_ranks,
        "tasks",
        lambda job, logs: [Task(11, 0, frozenset({USR2})), Task(12, 1, frozenset({USR2}))],
    )
    # The attempt after one stopped: what its ranks counted when they started.
    ended = End("preemption", 3, time.time(), True, False, "preemption at step 3", 0, 144, AttemptId(JOB, 0))
    records.append_attempt(run, ended)
    records.append_attempt(run, Begin(1, time.time(), "laptop", "laptop", AttemptId(JOB, 1)))
    said = actions.interrupt(str(run), "timeout")
    assert sent == [([11, 12], USR2)]
    assert json.loads((run / "interrupt.json").read_text()) == {
        "reason": "timeout",
        "job_id": JOB,
        "restart_count": 1,
    }
    assert said.startswith(
        "sent SIGUSR2 to the 2 ranks of local job 4242 (processes 11, 12), attempt 2, as a timeout"
    )


def test_the_ranks_are_signalled_once_each_runs_its_handler(
    run: Path, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[list[int], int]]
) -> None:
    """Between two attempts, or while a rank starts: a rank without the handler dies of USR2."""
    polls = iter([[Task(11, 0, frozenset())], [Task(11, 0, frozenset({USR2})), Task(12, 1, frozenset())]])
    ready = [Task(11, 0, frozenset({USR2})), Task(12, 1, frozenset({USR2}))]
    monkeypatch.setattr(local_ranks, "world_size", lambda job, logs: 2)
    monkeypatch.setattr(local_ranks, "tasks", lambda job, logs: next(polls, ready))
    actions.interrupt(str(run), "preemption")
    assert sent == [([11, 12], USR2)]

    monkeypatch.setattr(local_ranks, "tasks", lambda job, logs: [Task(11, 0, frozenset({USR2}))])
    monkeypatch.setattr(backend, "LOCAL_READY_WAIT_S", 0.3)
    with pytest.raises(
        SlurmddpError, match="local job 4242: 1 of its 2 ranks are ready for the stop signal after 0 s"
    ):
        actions.interrupt(str(run), "preemption")
    assert len(sent) == 1


def test_between_two_attempts_the_signal_waits_for_the_next_ones_begin(
    run: Path, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[list[int], int]]
) -> None:
    """Rank 0 recorded the end of attempt 1; the ranks still there are attempt 1's, leaving."""
    ended = End("preemption", 3, time.time(), True, False, "preemption at step 3", 0, 144, AttemptId(JOB, 0))
    records.append_attempt(run, ended)
    ranks = [Task(11, 0, frozenset({USR2})), Task(12, 1, frozenset({USR2}))]
    polls: list[int] = []

    def tasks(job: str, logs: Path) -> list[Task]:
        polls.append(len(polls))
        if len(polls) == 3:  # the controller started attempt 2; its rank 0 records its begin
            records.append_attempt(run, Begin(1, time.time(), "laptop", "laptop", AttemptId(JOB, 1)))
        return ranks

    monkeypatch.setattr(local_ranks, "world_size", lambda job, logs: 2)
    monkeypatch.setattr(local_ranks, "tasks", tasks)
    said = actions.interrupt(str(run), "preemption")
    assert len(polls) == 4 and sent == [([11, 12], USR2)]
    assert json.loads((run / "interrupt.json").read_text())["restart_count"] == 1
    assert "attempt 2, as a preemption" in said


def test_a_script_rank_is_ready_once_its_script_runs_with_its_handler(
    run: Path, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[list[int], int]]
) -> None:
    """Its rank passes the signal on only to a script it started; stopped before every rank
    reached rank 0's store, the script would leave the late ranks waiting on it."""
    (run / "config.yaml").write_text("entrypoint:\n  function: null\n  script: train.py\n")
    handled = frozenset({USR2})
    polls = iter(
        [
            [Task(11, 0, handled), Task(12, 1, handled)],
            [Task(11, 0, handled, frozenset({TERM})), Task(12, 1, handled, frozenset())],
        ]
    )
    ready = [Task(11, 0, handled, frozenset({TERM})), Task(12, 1, handled, frozenset({TERM}))]
    seen: list[list[Task]] = []

    def tasks(job: str, logs: Path) -> list[Task]:
        seen.append(next(polls, ready))
        return seen[-1]

    monkeypatch.setattr(local_ranks, "world_size", lambda job, logs: 2)
    monkeypatch.setattr(local_ranks, "tasks", tasks)
    actions.interrupt(str(run), "preemption")
    assert len(seen) == 3 and sent == [([11, 12], USR2)]


def test_an_ended_local_run_is_refused_with_why(
    run: Path, monkeypatch: pytest.MonkeyPatch, sent: list[tuple[list[int], int]]
) -> None:
    monkeypatch.setattr(
        local_ranks, "tasks", lambda job, logs: pytest.fail("looked for the ranks of an ended run")
    )
    records.append_attempt(
        run, End("completed", 9, time.time(), False, True, "completed", 0, 0, AttemptId(JOB, 0))
    )
    with pytest.raises(
        SlurmddpError, match=r"local job 4242 is not running: the run ended \(completed\)"
    ) as info:
        actions.interrupt(str(run), "preemption")
    assert info.value.exit_code == EXIT_USER_ERROR
    assert not (run / "interrupt.json").exists() and sent == []


def test_a_local_run_whose_controller_is_gone_is_refused(
    run: Path, sent: list[tuple[list[int], int]]
) -> None:
    # No final record (its rank 0 was killed), and no process 4242 that is this run's controller.
    with pytest.raises(SlurmddpError, match="local job 4242 is not running: its controller"):
        actions.interrupt(str(run), "preemption")
    assert not (run / "interrupt.json").exists() and sent == []


def test_status_says_how_each_attempt_ended(run: Path) -> None:
    me, then = AttemptId(JOB, 0), AttemptId(JOB, 1)
    records.append_attempt(
        run, End("preemption", 3, time.time(), True, False, "preemption at step 3", 0, 144, me)
    )
    records.append_attempt(run, Begin(1, time.time(), "laptop", "laptop", then))
    records.append_attempt(run, End("completed", 9, time.time(), False, True, "completed", 1, 0, then))
    target = runs.load(run)
    [row] = runs.rows(target)
    assert (row.state, row.attempts) == ("COMPLETED", 2)
    assert [(e.attempt, e.reason, e.step) for e in row.ended] == [(1, "preemption", 3), (2, "completed", 9)]
    text = report.status_table(target, [row], None)
    assert "\nrun: attempt 1: preemption at step 3; attempt 2: completed" in text, text
    assert report.status_json(target, [row])["elements"][0]["ended"][0]["reason"] == "preemption"


def test_status_says_which_attempts_restarted_in_their_allocation(run: Path) -> None:
    first, second = AttemptId(JOB, 0), AttemptId(JOB, 0, 1)
    failed = "failure at step 40; restart 1 of 3 in this allocation"
    records.append_attempt(
        run, End("failure", 40, time.time(), True, False, failed, 0, 1, first, in_job=True)
    )
    records.append_attempt(run, Begin(1, time.time(), "laptop", "laptop", second))
    records.append_attempt(run, End("completed", 90, time.time(), False, True, "completed", 1, 0, second))
    target = runs.load(run)
    [row] = runs.rows(target)
    assert row.attempts == 2
    text = report.status_table(target, [row], None)
    assert (
        "\nrun: attempt 1: failure at step 40, restarted in its allocation; attempt 2: completed" in text
    ), text
    assert report.status_json(target, [row])["elements"][0]["ended"][0]["in_job"] is True
