"""A task that outlives its rank (requeue.resident_launcher): the srun task imports torch once,
forks the rank, and after a crash forks the next attempt's rank in the same srun step, with the
imports already done (benchmarks/fork_start.py: 0.19 s to a first step against 5.5 s anew).

The rank's death ends every rank (the peer watch), so every task of the step comes here together.
Each writes how its rank ended into RUN_DIR/resident/ATTEMPT/; task 0, once all have, decides as
the batch script would (`attempts.end`) and, where that is a restart in the allocation on the same
nodes, records the next attempt's begin (`attempts.begin`) and writes the verdict every task
waits for: the next attempt's number, or an end. An end (a requeue, the run's end, a restart on
other nodes, a task that never reported) hands over to the batch script as before: each task
exits with its rank's status, srun returns, and `attempts end` finds the attempt recorded.

Files on the run directory, not a port: the ranks' nodes share it already, and no stranger can
write into it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from slurmddp.defaults import EXIT_RESTART_IN_JOB, IN_JOB_RESTART_ENV, RESIDENT_IMPORT_ENV
from slurmddp.files import write_atomic
from slurmddp.job.process import signals
from slurmddp.rundir.layout import RESIDENT
from slurmddp.rundir.records import AttemptId, Failure

PR_SET_CHILD_SUBREAPER = 36
REPORT_WAIT_S = 10.0
"""How long task 0 waits for every task's report: a task whose node went silent never reports,
and the step watch ends the step well within this."""
VERDICT_WAIT_S = 30.0
"""How long a task waits for task 0's verdict (its decision runs `attempts end`: squeue, sinfo)."""
POLL_S = 0.02
END = "end"

_rank: int | None = None
"""The rank this task forked and waits for, where stop signals go on to."""


def supervise(
    run_rank: Callable[[], None],
    run_dir: Path,
    logs: Path,
    env: Mapping[str, str],
    stop_signals: tuple[str, ...],
) -> NoReturn:
    """Run `run_rank` in a forked child, again after every crash the run restarts in place;
    exit with the last rank's status. `logs`: submitit's folder of the ranks' logs;
    `stop_signals`: the signals the ranks stop on, which this task passes on to its rank."""
    # A container runtime hands Slurm's signals to the container's first process only (runc's
    # `run`, Slurm's OCI support): that is this task, not its rank, which must hear of a
    # preemption all the same. Outside a container the rank gets them twice; it acts on the first.
    signals.install(stop_signals, then=_forward)
    # Loader workers orphaned by a dead rank come back to this process, which ends them: their
    # copies of the rank's sockets would hold the peers' connections open.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # The imports a rank's start pays for (RESIDENT_IMPORT_ENV): torch, and for a function's rank
    # torch._dynamo, which every optimizer's first step imports. No tensor operation here: the
    # forks must not inherit a started thread pool.
    importlib.import_module(env.get(RESIDENT_IMPORT_ENV) or "torch._dynamo")

    task = int(env.get("SLURM_PROCID") or 0)
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    attempt = AttemptId.from_env(env)
    while True:
        status = _run_child(run_rank, attempt.in_job_restart)
        if status == 0 or signals.stopping():
            # A signal from Slurm to the step (its end once a task died with its node, a
            # preemption, the time limit) leaves the decision to the batch script, as without this
            # launcher: waiting for reports here kept a step whose node's tasks died 10 s longer.
            os._exit(status)
        # With no rank running, a SIGTERM is the step's end (srun ending it once a task died with
        # its node, then SIGKILL after KillWait), not a stop for a rank to act on: go at once.
        as_the_rank = signal.signal(signal.SIGTERM, lambda *_, status=status: os._exit(status))
        folder = run_dir / RESIDENT / f"{attempt.allocation}.{attempt.in_job_restart}"
        write_atomic(folder / f"task-{task}", f"{status}\n")
        if task == 0:
            verdict = _decide(run_dir, logs, folder, tasks, env, attempt)
            write_atomic(folder / "verdict", f"{verdict}\n")
        else:
            verdict = _await_verdict(folder)
        if verdict == END or signals.stopping():
            os._exit(status)
        signal.signal(signal.SIGTERM, as_the_rank)
        attempt = AttemptId(attempt.job_id, attempt.restart_count, int(verdict))


def _run_child(run_rank: Callable[[], None], in_job_restart: int) -> int:
    """Fork the rank and wait for it (and for what it left behind); its status as srun reports
    one: the exit code, or 128 + the signal that ended it."""
    global _rank
    pid = os.fork()
    if pid == 0:
        _rank = None
        os.environ[IN_JOB_RESTART_ENV] = str(in_job_restart)
        code = 1
        try:
            run_rank()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            # What the interpreter's exit would run (trackers' atexit hooks), then out without
            # going back into the supervisor's loop.
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _rank = pid
    early = signals.received()
    if early is not None:
        # Recorded between the fork and the line above, where it went to no rank.
        _forward(early)
    _, wait_status = os.waitpid(pid, 0)
    _rank = None
    _end_orphans()
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _forward(signum: int) -> None:
    if _rank is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(_rank, signum)


def _end_orphans() -> None:
    """SIGKILL every process left as this one's child (a dead rank's loader workers), and reap it."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _decide(
    run_dir: Path, logs: Path, folder: Path, tasks: int, env: Mapping[str, str], attempt: AttemptId
) -> str:
    """Task 0: the next attempt's number where the run restarts in place, else END."""
    deadline = time.monotonic() + REPORT_WAIT_S
    while len(statuses := _reports(folder)) < tasks:
        if time.monotonic() > deadline:
            return END
        time.sleep(POLL_S)
    # Only here: the decision's modules are not worth their import in every task.
    from slurmddp.cluster import slurm
    from slurmddp.job.allocation import attempts

    if not all(slurm.available(tool) for tool in ("scontrol", "squeue", "sinfo")):
        # A container image without Slurm's commands: the batch script, outside it, decides.
        return END
    failure = Failure.read_for(run_dir, attempt)
    if failure is not None and failure.bad_hosts:
        # A host to leave out needs a new step, and the step watch ends this one for it: the batch
        # script decides, once, as it would without a resident launcher.
        return END

    here = {**env, IN_JOB_RESTART_ENV: str(attempt.in_job_restart)}
    # srun's status: the highest of its tasks'.
    decided = attempts.end(run_dir, max(statuses), here, time.time(), slurm.preempt_time, logs=logs)
    if decided != EXIT_RESTART_IN_JOB:
        return END
    return str(attempts.restart_in_place(run_dir, here, time.time()) or END)


def _reports(folder: Path) -> list[int]:
    found = []
    for path in folder.glob("task-*"):
        try:
            found.append(int(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def _await_verdict(folder: Path) -> str:
    deadline = time.monotonic() + VERDICT_WAIT_S
    path = folder / "verdict"
    while time.monotonic() < deadline:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            time.sleep(POLL_S)
    return END
