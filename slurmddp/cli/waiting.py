"""Following a submitted run to its end, as `submit --wait` and `resubmit --wait` do: the live
view, a Ctrl-C, the failure's summary, and the closing block (its rows and the next commands)."""

from __future__ import annotations

from typing import TextIO

from slurmddp.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from slurmddp.manage import ctrl_c, explain
from slurmddp.manage.display import print_block
from slurmddp.manage.follow import FINAL_OK, Follower
from slurmddp.manage.outcome import outcome
from slurmddp.submit.submitter import Submission


def follow_to_end(sub: Submission, out: TextIO) -> int:
    """Follow the run until it ends, then print its closing block; the command's exit status."""
    follower = Follower(sub, out)
    interrupted = False
    try:
        final = follower.run()
    except KeyboardInterrupt:
        if not ctrl_c.stop(sub, out):
            return EXIT_INTERRUPTED
        interrupted = True
        final = follower.run()
    if final != FINAL_OK and not interrupted:
        for line in explain.summary(sub.plan.run_dir):
            out.write(line + "\n")
    result = outcome(sub, final, follower.elapsed_s)
    print_block(out, result.rows, result.next_steps)
    if interrupted:
        return EXIT_INTERRUPTED
    return 0 if final == FINAL_OK else EXIT_JOB_FAILED
