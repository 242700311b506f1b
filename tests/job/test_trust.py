"""A rank unpickles its job only when nobody but its own user could have written the pickle or the
folder it is in: checked on files made here (the tests run as root, so os.chown can hand a file to
another uid), and through boot, where a refused pickle is never loaded."""

from __future__ import annotations

import os
import pickle
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from slurmddp.errors import UntrustedPickle
from slurmddp.job.launch import trust

ME = f"uid {os.geteuid()} ({pwd.getpwuid(os.geteuid()).pw_name})"
OTHER_UID = 54321
"""A uid that is not this process's (chown needs root, which the test machines are)."""
ENV = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "777", "SUBMITIT_LOCAL_GLOBALID": "0"}


def job_folder(tmp_path: Path, file_mode: int = 0o600, folder_mode: int = 0o700) -> tuple[Path, Path]:
    """A submitit folder holding job 777's pickle (which makes tmp_path/loaded when unpickled)."""
    folder = tmp_path / "logs"
    folder.mkdir()
    pkl = folder / "777_submitted.pkl"
    pkl.write_bytes(pickle.dumps(MakeDir(tmp_path / "loaded")))
    pkl.chmod(file_mode)
    folder.chmod(folder_mode)
    return folder, pkl


class MakeDir:
    """Unpickling it creates the directory `marker`: proof of whether it was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.marker,))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "41", "SLURM_PROCID": "3"}, "41_submitted.pkl"),
        (
            {
                "SUBMITIT_EXECUTOR": "slurm",
                "SLURM_JOB_ID": "45",
                "SLURM_ARRAY_JOB_ID": "40",
                "SLURM_ARRAY_TASK_ID": "5",
            },
            "40_5_submitted.pkl",
        ),
        (ENV, "777_submitted.pkl"),
    ],
)
def test_the_pickle_is_the_one_submitit_loads(environ: dict[str, str], name: str, tmp_path: Path) -> None:
    from submitit.core.utils import JobPaths

    assert trust.submitted_pickle(str(tmp_path), environ) == tmp_path / name
    job_id = (
        f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
        if "SLURM_ARRAY_JOB_ID" in environ
        else environ.get("SLURM_JOB_ID") or environ["SUBMITIT_LOCAL_JOB_ID"]
    )
    assert JobPaths(tmp_path, job_id=job_id).submitted_pickle == tmp_path / name


def test_a_folder_with_submitit_placeholders_is_formatted_as_submitit_does(tmp_path: Path) -> None:
    from submitit.core.utils import JobPaths

    environ = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "5"}
    folder = f"{tmp_path}/%A/%a/%j/%t"
    expected = JobPaths(folder, job_id="40_5", task_id=2).submitted_pickle
    assert trust.submitted_pickle(folder, {**environ, "SLURM_PROCID": "2"}) == expected


def test_an_unknown_executor_or_job_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UntrustedPickle, match="SUBMITIT_EXECUTOR is 'pbs'"):
        trust.submitted_pickle(str(tmp_path), {"SUBMITIT_EXECUTOR": "pbs"})
    with pytest.raises(UntrustedPickle, match="SLURM_JOB_ID is not set"):
        trust.submitted_pickle(str(tmp_path), {"SUBMITIT_EXECUTOR": "slurm"})


def test_a_file_and_folder_only_we_can_write_are_trusted(tmp_path: Path) -> None:
    _, pkl = job_folder(tmp_path, 0o644, 0o755)
    assert trust.untrusted(pkl, os.geteuid()) == []
    assert trust.check_submitted(str(pkl.parent), ENV) == pkl


@pytest.mark.parametrize(
    ("file_mode", "folder_mode", "needle"),
    [
        (0o606, 0o700, "the file {pkl} may be written by others (owner {me}, mode 0606)"),
        (0o660, 0o700, "the file {pkl} may be written by its group (owner {me}, mode 0660)"),
        (0o600, 0o777, "its folder {folder} may be written by its group and others"),
        (0o600, 0o1777, "its folder {folder} may be written by its group and others"),
    ],
)
def test_what_others_may_write_is_refused(
    tmp_path: Path, file_mode: int, folder_mode: int, needle: str
) -> None:
    folder, pkl = job_folder(tmp_path, file_mode, folder_mode)
    with pytest.raises(UntrustedPickle) as caught:
        trust.check_submitted(str(folder), ENV)
    message = str(caught.value)
    assert message.startswith(f"refusing to unpickle the job {pkl}: ")
    assert needle.format(pkl=pkl, folder=folder, me=ME) in message
    assert "nothing was run" in message and "Submit again" in message


@needs_root
@pytest.mark.parametrize("which", ["file", "folder"])
def test_what_another_user_owns_is_refused(tmp_path: Path, which: str) -> None:
    folder, pkl = job_folder(tmp_path)
    os.chown(pkl if which == "file" else folder, OTHER_UID, -1)
    problems = trust.untrusted(pkl, os.geteuid())
    target = pkl if which == "file" else folder
    assert len(problems) == 1
    assert f"{target} belongs to another user (owner uid {OTHER_UID}" in problems[0]
    assert f"this job runs as {ME}" in problems[0]


def test_a_pickle_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / "777_submitted.pkl", 0o600)
    with pytest.raises(UntrustedPickle, match="is not a regular file"):
        trust.check_submitted(str(folder), ENV)


def test_a_pickle_that_never_appears_is_refused_after_the_wait(tmp_path: Path) -> None:
    with pytest.raises(UntrustedPickle, match=r"777_submitted.pkl did not appear within 0 s"):
        trust.check_submitted(str(tmp_path), ENV, timeout_s=0.1, poll_s=0.05)


def boot(folder: Path) -> subprocess.CompletedProcess[str]:
    """A task's start as submitit's local executor makes it, on `folder`."""
    return subprocess.run(
        [
            sys.executable,
            "-u",
            "-m",
            "slurmddp.job.launch.boot",
            "-u",
            "-m",
            trust.SUBMITIT_RUNNER,
            str(folder),
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_boot_refuses_a_pickle_others_may_write_before_loading_it(tmp_path: Path) -> None:
    folder, pkl = job_folder(tmp_path, file_mode=0o666)
    proc = boot(folder)
    assert proc.returncode != 0
    assert not (tmp_path / "loaded").exists(), "the pickle was loaded"
    said = f"slurmddp: refusing to unpickle the job {pkl}: the file {pkl} may be written by its group and "
    assert said in proc.stderr
    assert "mode 0666" in proc.stderr and "Traceback" not in proc.stderr


def test_boot_hands_a_trusted_pickle_to_submitit(tmp_path: Path) -> None:
    folder, _ = job_folder(tmp_path)
    proc = boot(folder)
    # The pickle is not a submitit job, so submitit fails after loading it: what matters is that
    # it was loaded.
    assert (tmp_path / "loaded").is_dir(), proc.stderr
    assert "refusing" not in proc.stderr
