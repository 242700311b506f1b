"""Runs a torchrun-style script (or `-m module`) as `python script.py` would, counting its steps.

    python -m slurmddp.job.script.scriptrun SCRIPT ARGS...      # as python SCRIPT ARGS...
    python -m slurmddp.job.script.scriptrun -m MODULE ARGS...   # as python -m MODULE ARGS...

A script has no ctx.loop, but every trainer built on PyTorch (plain loops, Lightning, accelerate)
steps a torch.optim optimizer: a global optimizer-step hook counts the steps of this attempt. The
count goes to the file STEP_FILE_ENV names (8 bytes written in place, no fsync: the rank's own
process, job/script/scriptrank.py, reads it on the same node), from which the rank records where the
attempt crashed (a crash after the same number of steps twice in a row stops the job) and rank 0
shows progress. The hang watchdog (job/process/watchdog.py) runs in this process, so its stacks are the
script's own; it is fed by the steps and by every batch a DataLoader hands out (an evaluation makes
no optimizer step).

The same file says when the script ended with status 0 and every exit handler it registered has
run: what is left after that is Python shutting down. A C++ thread that takes the GIL then is ended
by CPython with pthread_exit, which in C++ can abort the process (`terminate called without an
active exception`, SIGABRT) with the script's work done; pytorch/pytorch#179291 names gloo's worker
threads, releasing a collective's tensors. So once the mark is written the process flushes its
standard streams and leaves with os._exit(0), without that teardown. Should it die between the mark
and its exit, the rank's process reads the mark and counts the death as the completion it was.

The stop signals are this process's too: Slurm sends `--signal`'s to every process of the step,
and USR2's default action would kill the script before it could save. Their handler only records
the signal for `slurmddp.should_stop()` (job/process/stop.py). A script that never asks it still dies of
the SIGTERM its rank passes on, as under torchrun, unless it handles SIGTERM itself. A script that
ended by `exit_for_requeue()` leaves the stop's signal in bytes 16-24, and the process leaves as
after a completion.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

from slurmddp.defaults import ALWAYS_STOP_ON, STOP_SIGNAL, STOP_SIGNALS_ENV
from slurmddp.job.process import forks, signals, startwatch, stop
from slurmddp.job.script import autoload, ddp_buckets, saves

STEP_FILE_ENV = "SLURMDDP_STEP_FILE"
WATCH_ENV = "SLURMDDP_WATCH"
"""JSON of the rank's DistEnv, `hang_timeout_s`, `start_timeout_s` and `began`, the rank's start
(time.monotonic(), the machine's clock); absent: no watchdog (both timeouts 0)."""
FINISHED = b"finished"
"""Bytes 8-16 of the step file once the script ended with status 0 and its exit handlers ran."""
RESUME_BUCKETS_ENV = "SLURMDDP_RESUME_BUCKETS"
"""Set (`ddp.resume_buckets`): a later attempt builds each DDP in the layout the first rebuilt."""
AUTO_ENV = "SLURMDDP_INTEGRATIONS_AUTO"
"""Set (`integrations: auto`): framework Trainers get slurmddp's callback when their module loads."""
STOPPED_AT = 16
"""Where the step file holds the signal of the stop the script ended on (8 bytes; 0: none)."""
RESUMED_AT = 24
"""Where the step file holds 1 + the step this attempt resumed from, once the script said it
(`anchor`; 8 bytes; 0: not said)."""
TOTAL_AT = 32
"""Where the step file holds the optimizer steps the whole run makes, once the script or its
framework's integration said it (`expect_total`; 8 bytes; 0: not said): progress shows an ETA."""
STEPS_BEFORE_ENV = "SLURMDDP_STEPS_BEFORE"
"""The optimizer steps the run's earlier attempts made: the most this attempt can resume from."""


class Steps:
    """The optimizer steps of this attempt, written where the rank's process reads them."""

    def __init__(self, path: str | None) -> None:
        self.count = 0
        self.succeeded = False
        self.stopped_on = 0
        self._pid = os.getpid()
        self._fd = os.open(path, os.O_WRONLY) if path else None

    def step(self, *_: Any) -> None:
        self.count += 1
        if self._fd is not None:
            os.pwrite(self._fd, self.count.to_bytes(8, "little"), 0)

    def at_exit(self) -> None:
        """Registered before torch and the script are imported, so (exit handlers run last-in
        first-out) after theirs: the script's trackers and loggers have flushed, and
        multiprocessing has joined its children, by now. After a status of 0 the process then
        leaves without the interpreter's teardown. A child the script forked inherits the handler;
        its own end is not the script's."""
        if not (self.succeeded or self.stopped_on) or os.getpid() != self._pid:
            return
        if self._fd is not None:
            if self.stopped_on:
                os.pwrite(self._fd, self.stopped_on.to_bytes(8, "little"), STOPPED_AT)
            else:
                os.pwrite(self._fd, FINISHED, 8)
        for stream in (sys.stdout, sys.stderr):
            # A script may have closed or replaced them; what cannot be flushed is lost either way.
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        os._exit(0)


def _field(path: Path, at: int) -> int:
    """The 8-byte number at byte `at` of a step file; 0 where it is not written (or no file)."""
    try:
        return int.from_bytes(path.read_bytes()[at : at + 8], "little")
    except OSError:
        return 0


def read_steps(path: Path) -> int | None:
    """The count a script's Steps wrote, None before its first step (a finished mark alone leaves
    the count's bytes zero)."""
    return _field(path, 0) or None


def read_finished(path: Path) -> bool:
    """Whether the script ended with status 0 and its exit handlers ran (Steps.at_exit)."""
    try:
        return path.read_bytes()[8:16] == FINISHED
    except OSError:
        return False


def read_stopped(path: Path) -> int | None:
    """The signal of the agreed stop the script ended on (`exit_for_requeue()`), if it did."""
    return _field(path, STOPPED_AT) or None


def read_resumed(path: Path) -> int | None:
    """The step this attempt resumed from, where the script said it (`anchor`)."""
    stored = _field(path, RESUMED_AT)
    return stored - 1 if stored else None


def anchor(step: int, *, recorded: bool = False) -> None:
    """The script says it is at `step` (its first `slurmddp.report`, `checkpoints.resume`, a DCP load):
    with the steps counted so far, that fixes the step this attempt resumed from. A script that
    resumed from a checkpoint of its own older than the stop makes the steps after it again, which
    the count of the run's steps would add twice. Kept only the first time, and only where it can
    be: a reported step from 0 to the steps the earlier attempts made (a script that numbers
    samples or epochs says nothing of its steps). A step slurmddp `recorded` itself (a checkpoint's)
    may exceed those: an attempt killed outright left its progress up to a poll behind its last
    save. Outside a script's process, nothing."""
    where = os.environ.get(STEP_FILE_ENV)
    if not where or read_resumed(Path(where)) is not None:
        return
    resumed = step - (read_steps(Path(where)) or 0)
    if resumed >= 0 and (recorded or resumed <= int(os.environ.get(STEPS_BEFORE_ENV, "0"))):
        fd = os.open(where, os.O_WRONLY)
        try:
            os.pwrite(fd, (resumed + 1).to_bytes(8, "little"), RESUMED_AT)
        finally:
            os.close(fd)


def expect_total(total: int) -> None:
    """The script says how many optimizer steps the whole run makes (`slurmddp.total_steps(N)`, a
    Trainer integration's): the latest said counts. Outside a script's process, nothing."""
    where = os.environ.get(STEP_FILE_ENV)
    if not where or total <= 0:
        return
    fd = os.open(where, os.O_WRONLY)
    try:
        os.pwrite(fd, int(total).to_bytes(8, "little"), TOTAL_AT)
    finally:
        os.close(fd)


def read_total(path: Path) -> int | None:
    """The run's total of optimizer steps, where the script said it (`expect_total`)."""
    return _field(path, TOTAL_AT) or None


def run_step(path: Path, before: int) -> tuple[int, int | None]:
    """(the step this attempt started from, the step it is at): from where the script said it
    resumed, else from the steps the earlier attempts made (`before`: right for an integration,
    which never makes a step twice); the second is None before the first step."""
    started = read_resumed(path)
    started = before if started is None else started
    count = read_steps(path)
    return started, None if count is None else started + count


def current_step() -> int:
    """In the script's process: the step the run is at (`run_step` over its own step file)."""
    before = int(os.environ.get(STEPS_BEFORE_ENV, "0"))
    where = os.environ.get(STEP_FILE_ENV)
    started, step = run_step(Path(where), before) if where else (before, None)
    return started if step is None else step


def _on_stop_signal(signum: int) -> None:
    """A SIGTERM that nothing will act on ends the script as it would without slurmddp; a script
    that asks `should_stop()` stops at its next boundary instead."""
    if signum == signal.SIGTERM and not stop.armed():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _watchdog() -> Any:
    watch = os.environ.get(WATCH_ENV)
    if not watch:
        return None
    from slurmddp.job.process.distenv import DistEnv
    from slurmddp.job.process.watchdog import Watchdog

    fields = json.loads(watch)
    timeout, start, began = (fields.pop(key) for key in ("hang_timeout_s", "start_timeout_s", "began"))
    return Watchdog(Path(os.environ["SLURMDDP_RUN_DIR"]), DistEnv(**fields), timeout, start, began=began)


def _beat_on_batches(watchdog: Any) -> None:
    """Every DataLoader batch (of any loader, in any loop) is progress to the watchdog."""
    from torch.utils.data import dataloader

    original = dataloader._BaseDataLoaderIter.__next__

    def beating(self: Any) -> Any:
        watchdog.beat()
        return original(self)

    dataloader._BaseDataLoaderIter.__next__ = beating  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    names = os.environ.get(STOP_SIGNALS_ENV, f"{STOP_SIGNAL},{ALWAYS_STOP_ON}")
    signals.install(tuple(names.split(",")), then=_on_stop_signal)
    steps = Steps(os.environ.get(STEP_FILE_ENV))
    atexit.register(steps.at_exit)
    # Before torch is imported: its import is part of the start the deadline covers.
    watchdog = _watchdog()
    # The script's loader workers must not keep its gloo/NCCL listening sockets (job/process/forks.py).
    forks.install()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(steps.step)
    if os.environ.get(RESUME_BUCKETS_ENV):
        ddp_buckets.install(Path(os.environ["SLURMDDP_RUN_DIR"]), int(os.environ.get("RANK", "0")))
    if os.environ.get(AUTO_ENV):
        autoload.install()
    saves.install(current_step, functools.partial(anchor, recorded=True))
    if watchdog is not None:
        # The script's own code from here; where it meets the others, its stack tells.
        watchdog.phase(startwatch.SETUP)
        # After steps.step (hooks run in the order they were registered): it reads the new count.
        register_optimizer_step_post_hook(lambda *_: watchdog.at(steps.count))
        _beat_on_batches(watchdog)
    try:
        _run(argv)
    except SystemExit as exc:
        steps.succeeded = exc.code in (None, 0)
        raise
    except stop.StopForRequeue as exc:
        steps.stopped_on = exc.signum
        print(f"slurmddp: {exc}", file=sys.stderr, flush=True)
        return
    steps.succeeded = True


def _run(argv: list[str]) -> None:
    if argv[0] == "-m":
        # `python -m` leaves the working directory first on sys.path, as this process has it.
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        # `python script.py` puts the script's directory first on sys.path.
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
