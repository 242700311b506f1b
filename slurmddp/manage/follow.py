"""`submit --wait`: follow a job to its end, showing its state changes, rank 0's output and how far
its training loop got (read by manage/snapshot.py, drawn by manage/display.py)."""

from __future__ import annotations

import pickle
import re
import time
from typing import TextIO

from rich.console import Console
from submitit.core.utils import pickle_load

from slurmddp.cluster.slurm import JobState
from slurmddp.manage import numbers
from slurmddp.manage.backend import for_executor
from slurmddp.manage.runs import FINAL_STATES
from slurmddp.manage.snapshot import RunWatch
from slurmddp.manage.tail import Tail
from slurmddp.manage.views import LiveView, PlainView
from slurmddp.rundir.records import final_end, read_attempts
from slurmddp.submit.submitter import Submission

# The one end state that counts as success (sacct's spelling); every other end state fails `--wait`.
FINAL_OK: JobState = "COMPLETED"
POLL_S = 0.5
"""Between two looks at the job: its end is seen this long after it came, at most."""


_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")
_SUBMITIT_ERROR = "Submitted job triggered an exception"
"""submitit logs it twice before every traceback of a rank's function."""


class Follower:
    """One job followed; `run` may be called again after a Ctrl-C, and goes on where it stopped
    (rank 0's lines are not shown twice)."""

    def __init__(self, sub: Submission, out: TextIO, poll_s: float = POLL_S) -> None:
        self.sub = sub
        self.out = out
        self.poll_s = poll_s
        self.started = time.monotonic()
        self.console = Console(file=out, highlight=False)
        self.backend = for_executor(sub.plan.executor)
        self.tails = [Tail(sub.log_path(0, "out")), Tail(sub.log_path(0, "err"))]
        self.folded = TracebackFold()
        self.teardown = StopFold()
        self.watch = RunWatch(sub.plan.run_dir)
        self.last_state: JobState | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> JobState:
        """Block until the job ends; return its final state (COMPLETED on success)."""
        # rich's test for a terminal that can redraw (isatty, not TERM=dumb; TTY_COMPATIBLE and
        # FORCE_COLOR override it).
        with LiveView(self.console) if self.console.is_interactive else PlainView(self.out) as view:
            while True:
                state = self.backend.live_state(self.sub)
                for tail in self.tails:
                    for line in tail.new_lines():
                        self.watch.note(line)
                        if not self.teardown.hides(line) and not self.folded.hides(line):
                            view.say(f"  [rank 0] {line}")
                if state is None:
                    break
                if state != self.last_state:
                    view.say(f"slurmddp: job {self.sub.job_id} {state} ({numbers.duration(self.elapsed_s)})")
                    self.last_state = state
                view.show(self.watch.snapshot(state, self.elapsed_s))
                time.sleep(self.poll_s)
            view.show(self.watch.snapshot(None, self.elapsed_s), final=True)
        final = self.final_state()
        self.out.write(
            f"slurmddp: job {self.sub.job_id} ended {final} after {numbers.duration(self.elapsed_s)} "
            "since its submission\n"
        )
        self.out.flush()
        return final

    def final_state(self) -> JobState:
        sub = self.sub
        final = self.backend.final_state(sub)
        ended = final_end(read_attempts(sub.plan.run_dir))
        if final == "UNKNOWN" and ended is not None:
            # A cancelled local run's ranks end cleanly, and their results say success.
            final = FINAL_STATES.get(ended.reason, "FAILED")
        if final == "UNKNOWN":
            final = _from_results(sub)
        return final


class TracebackFold:
    """Leaves a rank's tracebacks out of what is shown, all but their last line (the exception):
    the log keeps them whole, and a failed run ends with a summary naming the user's own line and
    that log (manage/explain.py), which 50 lines of runpy, submitit and slurmddp frames would bury."""

    def __init__(self) -> None:
        self.inside = False

    def hides(self, line: str) -> bool:
        # torch.distributed prefixes what a rank writes to stderr with "[rankN]: ".
        text = _RANK_PREFIX.sub("", line, count=1)
        if text.startswith("Traceback (most recent call last):"):
            self.inside = True
            return True
        if _SUBMITIT_ERROR in text:
            return True
        if self.inside and (text.startswith((" ", "\t")) or not text):
            return True
        self.inside = False
        return False


_REQUEUED = re.compile(r"^slurmddp: attempt ended: (preemption|timeout|interrupt)\b.*; requeue \d+")
"""Rank 0's line for an attempt that stopped and saved, and goes back to the queue."""
_NEXT_ATTEMPT = "slurmddp: rank 0 of "
_BATCH_SIGTERM = "slurmddp: batch script got SIGTERM"
"""The batch script's trap (submit/batch/setup.sh.j2), which a requeue's SIGTERM sets off."""
_TORCH_NOISE = "hostname of the client socket cannot be retrieved"
"""torch's warning at every connection where the peers' addresses have no name (no reverse DNS)."""


class StopFold:
    """Leaves out what a healthy requeue prints after the ranks stopped and saved, until the next
    attempt's first line: Slurm ending the job's steps (srun's "Job step aborted", slurmstepd's
    "CANCELLED ... DUE TO JOB REQUEUE"), and the ranks' loader workers dying of the SIGTERM Slurm
    sends every process then. slurmddp's own lines stay; the logs keep everything."""

    def __init__(self) -> None:
        self.requeued = False

    def hides(self, line: str) -> bool:
        text = _RANK_PREFIX.sub("", line, count=1)
        if _TORCH_NOISE in text:
            return True
        if text.startswith(_NEXT_ATTEMPT):
            self.requeued = False
        elif _REQUEUED.match(text):
            self.requeued = True
            return False
        return self.requeued and (not text.startswith("slurmddp: ") or text.startswith(_BATCH_SIGTERM))


def follow(sub: Submission, out: TextIO, poll_s: float = POLL_S) -> JobState:
    """Block until the job ends; return its final state (COMPLETED on success)."""
    return Follower(sub, out, poll_s).run()


def _from_results(sub: Submission) -> JobState:
    """The end state from the result pickle each task writes, where accounting cannot tell:
    the local executor, or a cluster without slurmdbd."""
    for task in range(sub.plan.world_size):
        path = sub.plan.folder / f"{sub.job_id}_{task}_result.pkl"
        try:
            outcome = pickle_load(path)[0]
        except (OSError, EOFError, pickle.UnpicklingError):
            return "FAILED"
        if outcome != "success":
            return "FAILED"
    return FINAL_OK
