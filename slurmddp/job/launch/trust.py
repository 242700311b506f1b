"""Whether a rank may unpickle the job submitit left for it.

Unpickling runs code: whoever can replace `FOLDER/JOBID_submitted.pkl` runs code as the job's owner
on every node of the job. So before submitit's runner loads it, the rank checks that the file and
its folder belong to the rank's own user and that nobody else may write either; a folder only we can
write holds only files we put there. Light on purpose (the standard library only): it runs in
boot, before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import os
import pwd
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from slurmddp.errors import UntrustedPickle

SUBMITIT_RUNNER = "submitit.core._submit"
"""The module submitit starts in every task (`python -m submitit.core._submit FOLDER`)."""
SUBMITTED_PICKLE = "%j_submitted.pkl"
"""The file that runner loads (submitit 1.5.4: JobPaths.submitted_pickle, in its folder)."""
APPEAR_TIMEOUT_S = 60.0
"""submitit renames the pickle into place after sbatch returns the job id, so a task may start
before it exists; submitit's runner waits this long for it (process_job, submitit 1.5.4)."""

# How submitit's job environments (slurm and local, submitit 1.5.4) name the job and the task.
_JOB_ENV = {
    "slurm": ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID"),
    "local": ("SUBMITIT_LOCAL_JOB_ID", None, None, "SUBMITIT_LOCAL_GLOBALID"),
}


def runner_folder(args: list[str]) -> str:
    """The folder submitit's runner is given in `args`, read as its own parser reads them
    (submitit_main, submitit 1.5.4); arguments it would refuse end the task here the same way."""
    parser = argparse.ArgumentParser(prog=SUBMITIT_RUNNER, description="Run a job")
    parser.add_argument("folder", type=str, help="Folder where the jobs are stored (in subfolder)")
    return str(parser.parse_args(args).folder)


def submitted_pickle(folder: str, environ: Mapping[str, str]) -> Path:
    """The file submitit's runner will unpickle for `folder` in this task's environment, found as
    submitit finds it (its JobEnvironment picks the executor from SUBMITIT_EXECUTOR)."""
    executor = environ.get("SUBMITIT_EXECUTOR", "")
    if executor not in _JOB_ENV:
        raise UntrustedPickle(
            f"cannot tell which job pickle submitit would load from {folder}: SUBMITIT_EXECUTOR is "
            f"{executor!r}, not one of {', '.join(_JOB_ENV)}; nothing was loaded"
        )
    job_var, array_var, index_var, rank_var = _JOB_ENV[executor]
    array_id = environ.get(array_var) if array_var else None
    if array_id:
        job_id = f"{array_id}_{environ.get(index_var or '')}"
    elif job_var in environ:
        job_id = environ[job_var]
    else:
        raise UntrustedPickle(
            f"cannot tell which job pickle submitit would load from {folder}: {job_var} is not set; "
            "nothing was loaded"
        )
    task = environ.get(rank_var) or "0"
    return _format_id(Path(folder).expanduser().absolute() / SUBMITTED_PICKLE, job_id, task)


def _format_id(path: Path, job_id: str, task: str) -> Path:
    # submitit's JobPaths._format_id: %j job id, %t task, %A array job id, %a array index.
    text = str(path).replace("%j", job_id).replace("%t", task)
    array_id, _, index = job_id.partition("_")
    return Path(text.replace("%a", index).replace("%A", array_id))


def untrusted(path: Path, uid: int) -> list[str]:
    """Why the file `path` and its folder might hold someone else's writing; empty when both belong
    to the user `uid` and nobody else may write them."""
    problems = []
    for what, target in (("its folder", path.parent), ("the file", path)):
        info = os.stat(target)
        mode = stat.S_IMODE(info.st_mode)
        owner = f"owner {_user(info.st_uid)}, mode {mode:04o}"
        if info.st_uid != uid:
            mine = _user(uid)
            problems.append(f"{what} {target} belongs to another user ({owner}; this job runs as {mine})")
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = " and ".join(name for bit, name in _WRITERS if mode & bit)
            problems.append(f"{what} {target} may be written by {who} ({owner})")
        if target == path and not stat.S_ISREG(info.st_mode):
            problems.append(f"{path} is not a regular file ({owner})")
    return problems


_WRITERS = ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_submitted(
    folder: str,
    environ: Mapping[str, str],
    uid: int | None = None,
    timeout_s: float = APPEAR_TIMEOUT_S,
    poll_s: float = 0.2,
) -> Path:
    """Refuse (UntrustedPickle) to let this task unpickle its job unless the pickle and its folder
    are this process's user's and nobody else may write them; returns the pickle's path."""
    path = submitted_pickle(folder, environ)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() >= deadline:
            raise UntrustedPickle(
                f"the job pickle {path} did not appear within {timeout_s:.0f} s; nothing was run"
            )
        time.sleep(poll_s)
    problems = untrusted(path, os.geteuid() if uid is None else uid)
    if problems:
        raise UntrustedPickle(
            f"refusing to unpickle the job {path}: {'; '.join(problems)}. Whoever can write there "
            "could have replaced the job with code that runs as you, so nothing was run. Submit again "
            "into a new run directory (slurmddp creates them writable by you alone, as output_mode "
            "says); only if you know both are yours, take the write permission away (chmod go-w)"
        )
    return path
