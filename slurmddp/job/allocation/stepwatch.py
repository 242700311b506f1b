"""The batch script's watch over its srun step: it ends srun once the attempt's failure names a host
that the step cannot be ended on.

    python -m slurmddp.job.allocation.stepwatch RUN_DIR SRUN_PID [--submission N]

srun returns only once every task of its step has ended or Slurm has called the node of the ones
left down (SlurmdTimeout, 300 s by default): a node that stopped answering holds srun, and with it
the batch script's restart, for minutes after every other rank ended (seen on 22.05.8, a node's link
down and its processes stopped). The ranks know much sooner: rank 0's peer watch finds the silent
host in seconds and records it in the attempt's failure (job/process/peerwatch.py). So, beside srun, this
polls that record and SIGKILLs srun STEP_END_GRACE_S after it names a bad host, while srun still
runs. The next step starts with `srun --overlap` (submit/plan.py), so the resources the dead step
still holds on the good nodes until Slurm closes it do not keep it waiting.

Run by the batch script's `srun` function (submit/batch/setup.sh.j2) as srun's sibling, on the batch
host, outside any container the ranks run in; it imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from slurmddp.rundir import records
from slurmddp.rundir.layout import FAILURE
from slurmddp.rundir.records import AttemptId, Failure

POLL_S = 0.2
STEP_END_GRACE_S = 1.0
"""How long srun may take to end by itself after a failure that names a bad host: the ranks on the
good nodes end within a second of rank 0's word, and a node that answers lets srun return."""


def watch(run_dir: Path, srun: int, attempt: AttemptId, poll_s: float = POLL_S) -> str | None:
    """Wait while `srun` runs; end it when `attempt`'s failure names a bad host and srun outlives
    STEP_END_GRACE_S after it. What was done, for the batch script's log, or None."""
    named_at: float | None = None
    seen = 0.0
    while _alive(srun):
        changed = _mtime(run_dir / FAILURE)
        if named_at is None and changed != seen:
            seen = changed
            # The attempt that runs now: a resident launcher (requeue.resident_launcher) may have
            # started later ones in this step.
            now = records.latest_of_allocation(records.read_attempts(run_dir), attempt)
            failure = Failure.read_for(run_dir, now)
            if failure is not None and failure.bad_hosts:
                named_at = time.monotonic()
                hosts = ", ".join(sorted(failure.bad_hosts))
        if named_at is not None and time.monotonic() - named_at >= STEP_END_GRACE_S:
            os.kill(srun, signal.SIGKILL)
            return (
                f"ended srun: {hosts} is left out ({failure.error if failure else ''}), and srun would "
                "wait for its tasks until Slurm calls it down"
            )
        time.sleep(poll_s)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie answers kill(0): srun that ended but that the batch shell did not reap yet.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[2] == "--submission":
        run_dir = records.element_dir(Path(argv[0]), int(argv[3]), os.environ)
        argv = [str(run_dir), argv[1]]
    if len(argv) != 2 or not argv[1].isdigit():
        print(
            "usage: python -m slurmddp.job.allocation.stepwatch RUN_DIR SRUN_PID [--submission N]",
            file=sys.stderr,
        )
        return 2
    # The batch shell's SIGTERM (a time limit, a preemption) is srun's to handle, not this one's.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    done = watch(Path(argv[0]), int(argv[1]), AttemptId.from_env(os.environ))
    if done is not None:
        print(f"slurmddp: {done}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
