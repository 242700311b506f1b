"""Ranks that never reached slurmddp: srun ran their command, but the interpreter it names was not
there, or it could not import slurmddp (a container image without it, a node's environment that
lacks it). Nothing of slurmddp ran to record why (the boot's own checks of an image need the boot),
so their stderr is the only word of it. Every retry would meet the same interpreter: the attempt
is a failure not to retry, with that word quoted."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from slurmddp.defaults import VERSION
from slurmddp.rundir.records import AttemptId, Failure

NO_SLURMDDP = re.compile(r"No module named '?slurmddp\b")
"""Python's own words (`python -m slurmddp.job.launch.boot` where slurmddp is not installed)."""
NO_PROGRAM = re.compile(
    r"(execve\(\)|exec: |exec failed|FATAL).*(no such file or directory|executable file not found)", re.I
)
"""How each starter says the program is not there: slurmstepd (plain srun and pyxis:
`execve(): PATH: No such file or directory`), runc (`exec: "PATH": stat PATH: no such file or
directory`), crun (`executable file ... not found`), Apptainer (`FATAL: "python3": executable file
not found in $PATH`)."""


BAD_ROOT = re.compile(r"invalid rootfs")
"""runc's words for an OCI bundle whose root filesystem it cannot use (`invalid rootfs: stat
BUNDLE/rootfs: no such file or directory`, `... not an absolute path, or a symlink`)."""


def failure(tails: Mapping[int, str], attempt: AttemptId) -> Failure | None:
    """The failure `tails` (each task's stderr, ranklogs.stderr_tails) show, if they show one."""
    for pattern, advice in ((NO_SLURMDDP, _NO_SLURMDDP), (NO_PROGRAM, _NO_PROGRAM), (BAD_ROOT, _BAD_ROOT)):
        for task, text in sorted(tails.items()):
            line = next((line for line in text.splitlines() if pattern.search(line)), None)
            if line is not None:
                error = f"rank {task} never started: {advice} (its stderr: {line.strip()})"
                return Failure(None, task, error, attempt, time.time(), retry=False)
    return None


_NO_SLURMDDP = (
    f"the ranks' Python has no slurmddp: install slurmddp {VERSION} where the ranks run (in the "
    "container image: pip install 'slurmddp=="
    f"{VERSION}'), or set container.python to a Python inside the image that has it"
)
_NO_PROGRAM = (
    "the ranks' interpreter is not where the job names it: set container.python to the path of the "
    "image's Python inside the image (for example /opt/venv/bin/python or /usr/bin/python3)"
)
_BAD_ROOT = (
    "the OCI bundle's root filesystem cannot be used: its config.json's root.path must name a "
    "directory (not a symlink), by default the bundle's rootfs/"
)
