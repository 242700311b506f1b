"""The first code a task runs: `python -u -m slurmddp.job.launch.boot -u -m submitit.core._submit FOLDER`
(submitit appends its own `-u -m submitit.core._submit FOLDER` to the interpreter command).

It installs the stop-signal flag before anything heavy is imported, checks that nobody else could
have written the job pickle submitit's runner is about to load (job/launch/trust.py), then hands over to
that runner. submitit's runner installs handlers of its own just before it calls the rank, and the
rank puts ours back first thing; until then a signal is recorded, not fatal.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from slurmddp.cluster import hostlist
from slurmddp.defaults import (
    ALWAYS_STOP_ON,
    RESIDENT_ENV,
    STOP_SIGNAL,
    STOP_SIGNALS_ENV,
    SUBMITTED_WITH_ENV,
    TASK_IDS_FROM_HOST_ENV,
    VERSION,
)
from slurmddp.errors import UntrustedPickle
from slurmddp.job.launch import trust
from slurmddp.job.process import signals


def main(argv: list[str]) -> None:
    os.environ.update(container_task_ids(os.environ, socket.gethostname()))
    stop_signals = tuple(os.environ.get(STOP_SIGNALS_ENV, f"{STOP_SIGNAL},{ALWAYS_STOP_ON}").split(","))
    signals.install(stop_signals)
    # submitit sets its logger's level from this when it is first imported (by the runner below);
    # at INFO it writes four lines of its own into every rank's log. A user's own setting stands.
    os.environ.setdefault("SUBMITIT_LOG_LEVEL", "WARNING")
    if argv[:1] == ["-u"]:
        argv = argv[1:]  # already in effect: the interpreter was started with -u
    if argv[:1] != ["-m"] or len(argv) < 2:
        raise SystemExit("usage: python -u -m slurmddp.job.launch.boot [-u] -m MODULE [ARGS...]")
    if argv[1] == trust.SUBMITIT_RUNNER:
        _check_image(argv[2:])
        _check_pickle(argv[2:])
        if os.environ.get(RESIDENT_ENV) == "1":
            _resident(argv, stop_signals)
    _run(argv, stop_signals)


def _resident(argv: list[str], stop_signals: tuple[str, ...]) -> None:
    """requeue.resident_launcher: this task stays for the allocation and forks each attempt's rank;
    returns only where there is no run directory to agree through."""
    from slurmddp.job.launch import resident
    from slurmddp.rundir.records import run_dir_of

    folder = Path(trust.runner_folder(argv[2:]))
    run_dir = run_dir_of(folder, os.environ)
    if run_dir is not None:
        resident.supervise(lambda: _run(argv, stop_signals), run_dir, folder, os.environ, stop_signals)


def _run(argv: list[str], stop_signals: tuple[str, ...]) -> None:
    sys.argv = [argv[1], *argv[2:]]
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except Exception:
        # The crash is recorded (job/process/crash.py) and submitit wrote its result: leave at once.
        # Python's shutdown would collect every object torch made first, 1-5 s while srun holds
        # the step and the restart (or the requeue) waits.
        sys.excepthook(*sys.exc_info())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    finally:
        # The work is done: from here a stop signal must not kill the process. Python puts every
        # signal with a Python handler back to its default action while it shuts down, and USR2's
        # default is to terminate: a time-limit signal in those last milliseconds made srun report
        # a finished rank as killed by signal 12 (seen on the lab, Slurm 22.05.8).
        signals.ignore(stop_signals)


def container_task_ids(env: Mapping[str, str], hostname: str) -> dict[str, str]:
    """The task's own Slurm variables where its container was handed the wrong ones: on Slurm
    22.05 an OCI container gets srun's environment, not the task's (SLURM_PROCID=0 of the batch
    script, or none), and runs one task per node (the submit side set TASK_IDS_FROM_HOST_ENV).
    Its node, and so its rank, is its host's place in the step's node list: the container shares
    the node's hostname."""
    if env.get(TASK_IDS_FROM_HOST_ENV) != "1" or "SLURM_STEP_NODELIST" not in env:
        return {}
    nodes = hostlist.expand(env["SLURM_STEP_NODELIST"])
    short = hostname.split(".", 1)[0]
    if short not in nodes:
        return {}
    node = str(nodes.index(short))
    return {"SLURM_PROCID": node, "SLURM_NODEID": node, "SLURM_LOCALID": "0"}


IMAGE_NEEDS = ("torch", "submitit")
"""What a rank imports besides slurmddp: a container image must hold them."""


def _check_image(args: list[str]) -> None:
    """In a container (the submit side named its version), refuse an image that cannot run the
    job: one without torch or submitit, or with another slurmddp than the one that submitted. The
    attempt is recorded as a failure not to retry: the next would find the same image."""
    wanted = os.environ.get(SUBMITTED_WITH_ENV)
    if wanted is None:
        return
    problems = [f"no {name}" for name in IMAGE_NEEDS if importlib.util.find_spec(name) is None]
    if wanted != VERSION:
        problems.append(f"slurmddp {VERSION} where the job was submitted with slurmddp {wanted}")
    if problems:
        error = (
            f"the container's {sys.executable} cannot run this job: it has {' and '.join(problems)}; "
            f"install them in the image (pip install 'slurmddp=={wanted}' torch), or mount a "
            "Python environment that has them (container.mounts, container.python)"
        )
        _record_refusal(trust.runner_folder(args), error)
        raise SystemExit(f"slurmddp: {error}")


def _check_pickle(args: list[str]) -> None:
    """Refuse, before it is unpickled, a job that another user could have written; the attempt
    is recorded as a failure not to retry (a requeued job would be refused again)."""
    folder = trust.runner_folder(args)
    try:
        trust.check_submitted(folder, os.environ)
    except UntrustedPickle as exc:
        _record_refusal(folder, str(exc))
        raise SystemExit(f"slurmddp: {exc}") from None


def _record_refusal(folder: str, error: str) -> None:
    # Only on this path: the attempt record's imports are not worth their time at every start.
    from slurmddp.rundir.records import AttemptId, Failure, run_dir_of

    run_dir = run_dir_of(Path(folder), os.environ)
    if run_dir is None:
        return
    Failure(
        step=None,
        rank=int(os.environ.get("SLURM_PROCID") or 0),
        error=error,
        attempt=AttemptId.from_env(os.environ),
        time=time.time(),
        retry=False,
    ).write(run_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
