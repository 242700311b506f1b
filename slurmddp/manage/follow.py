"""`submit --wait`: follow a job to its end, showing its state changes, rank 0's output and how far
its training loop got.

The progress line (step, speed, ETA, the latest metrics, the attempt) is redrawn in place by rich on
a terminal; anywhere else (CI, nohup, a pipe) it is written as a plain line at most every
PLAIN_EVERY_S, so such logs stay readable.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text
from submitit.core.utils import pickle_load

from slurmddp.cluster.slurm import JobState
from slurmddp.job.records import Progress, final_end, read_attempts
from slurmddp.layout import METRICS, PERF
from slurmddp.manage.backend import for_executor
from slurmddp.manage.runs import FINAL_STATES
from slurmddp.submit.submitter import Submission

# The one end state that counts as success (sacct's spelling); every other end state fails `--wait`.
FINAL_OK: JobState = "COMPLETED"
PLAIN_EVERY_S = 10.0
"""Off a terminal: the least time between two progress lines."""
MAX_METRICS = 4
"""Metrics shown on the progress line (the first ones logged): more would not fit."""
RATE_SMOOTHING = 0.3
"""Weight of the newest speed: rank 0 writes progress.json every ~2 s, so a few records' average
steadies the ETA without hiding a change of speed for long."""
WAITING = "waiting for the training loop to start"


def follow(sub: Submission, out: TextIO, poll_s: float = 1.0) -> JobState:
    """Block until the job ends; return its final state (COMPLETED on success)."""
    started = time.monotonic()
    console = Console(file=out, highlight=False)
    # rich's test for a terminal that can redraw a line (isatty, not TERM=dumb; TTY_COMPATIBLE and
    # FORCE_COLOR override it).
    if console.is_interactive:
        with Live(Text(WAITING), console=console, auto_refresh=False) as live:
            _watch(sub, _LiveLine(live), poll_s, started)
    else:
        _watch(sub, _PlainLines(out), poll_s, started)
    final = for_executor(sub.plan.executor).final_state(sub)
    ended = final_end(read_attempts(sub.plan.run_dir))
    if final == "UNKNOWN" and ended is not None:
        # A cancelled local run's ranks end cleanly, and their results say success.
        final = FINAL_STATES.get(ended.reason, "FAILED")
    if final == "UNKNOWN":
        final = _from_results(sub)
    out.write(f"slurmddp: job {sub.job_id} ended {final} ({time.monotonic() - started:.0f}s)\n")
    out.flush()
    return final


def progress_line(progress: Progress, metrics: Mapping[str, Any], rate: float | None) -> str:
    """The progress line from rank 0's latest progress.json, the latest metric values (a
    metrics.jsonl record, or several merged) and the speed in steps per second (None: not known)."""
    step = progress.step
    loop = progress.loop
    total = loop.total_steps if loop is not None else None
    parts = [f"step {step}"]
    if total:
        parts[0] += f"/{total} ({100 * step // total}%)"
    parts.append(f"{_rate(rate)} steps/s")
    eta = (total - step) / rate if total and rate else None
    parts.append(f"ETA {_duration(eta)}")
    # The loop counts epochs from 0, and reports epoch 0 of no epochs when it is not given `data`.
    if loop is not None and loop.epochs is not None:
        parts.append(f"epoch {(loop.epoch or 0) + 1}/{loop.epochs}")
    parts.append(f"attempt {progress.attempt.restart_count + 1}")
    shown = format_metrics(metrics)
    if shown:
        parts.append(shown)
    return "  ".join(parts)


def format_metrics(values: Mapping[str, Any]) -> str:
    """`loss=0.4123 val_acc=0.9500`: the first MAX_METRICS numbers, to 4 significant digits."""
    numbers = [
        (name, value)
        for name, value in values.items()
        if name not in ("step", "time")
        and not name.startswith(PERF)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    ]
    # `#` keeps trailing zeros, so the line does not jitter as digits come and go; it also leaves a
    # bare "." after a whole number ("1235."), which says nothing.
    return " ".join(f"{name}={value:#.4g}".rstrip(".") for name, value in numbers[:MAX_METRICS])


def _rate(rate: float | None) -> str:
    if rate is None:
        return "?"
    # 3 significant digits, without the exponent that `g` uses from 1000 on.
    return f"{rate:.0f}" if rate >= 1000 else f"{rate:.3g}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(max(round(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class StepRate:
    """Steps per second between successive progress records of one attempt, smoothed.

    It starts over with each attempt: a requeued or resumed one restarts at its checkpoint's step,
    behind the last record of the attempt before."""

    def __init__(self) -> None:
        self.value: float | None = None
        self._last: tuple[int, int, float] | None = None
        """(restart_count, step, time) of the latest record."""

    def update(self, progress: Progress) -> float | None:
        """The speed after `progress`; reading the same record again changes nothing."""
        record = (progress.attempt.restart_count, progress.step, progress.time)
        last, self._last = self._last, record
        if last is None or record[0] != last[0] or record[1] < last[1]:
            self.value = None
        elif record[2] > last[2]:
            now = (record[1] - last[1]) / (record[2] - last[2])
            before = now if self.value is None else self.value
            self.value = RATE_SMOOTHING * now + (1 - RATE_SMOOTHING) * before
        return self.value


class LatestMetrics:
    """The latest value of each metric in metrics.jsonl, in the order the names first came.

    Values, not the last record: a loop that logs `loss` every step and `val_acc` once an epoch
    writes them in separate records, and the line shows both. The file grows for the whole run,
    so it is read on from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self._tail = _Tail(path)
        self.values: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        lines = self._tail.new_lines()
        if self._tail.rewound:
            # A resumed attempt rewrote the file without the records past its checkpoint.
            self.values = {}
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed rank 0
            if isinstance(record, dict):
                self.values.update(record)
        return self.values


class _View(Protocol):
    def say(self, line: str) -> None:
        """A line that stays: a state change, one of rank 0's lines."""

    def show(self, line: str | None, final: bool = False) -> None:
        """The progress line (None: no progress yet); `final` once the job ended."""


class _LiveLine:
    def __init__(self, live: Live) -> None:
        self.live = live

    def say(self, line: str) -> None:
        # Not markup: rank 0's output is the user's text ("[rank 0]" alone would be a style tag).
        self.live.console.print(Text(line), soft_wrap=True)

    def show(self, line: str | None, final: bool = False) -> None:
        self.live.update(Text(line or WAITING, no_wrap=True, overflow="ellipsis"), refresh=True)


class _PlainLines:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown = ""
        self.shown_at = -math.inf

    def say(self, line: str) -> None:
        self.out.write(f"{line}\n")
        self.out.flush()

    def show(self, line: str | None, final: bool = False) -> None:
        # A line is written only when it says something new: a new record changes it.
        if line is None or line == self.shown:
            return
        if final or time.monotonic() - self.shown_at >= PLAIN_EVERY_S:
            self.say(line)
            self.shown, self.shown_at = line, time.monotonic()


class _Progress:
    """The progress line of a run directory, from the files rank 0 writes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.metrics = LatestMetrics(run_dir / METRICS)
        self.rate = StepRate()
        self.record: Progress | None = None

    def line(self) -> str | None:
        # Not written yet, or unreadable: the previous record stands.
        self.record = Progress.read(self.run_dir) or self.record
        if self.record is None:
            return None
        return f"slurmddp: {progress_line(self.record, self.metrics.read(), self.rate.update(self.record))}"


def _watch(sub: Submission, view: _View, poll_s: float, started: float) -> None:
    tails = [_Tail(sub.log_path(0, "out")), _Tail(sub.log_path(0, "err"))]
    progress = _Progress(sub.plan.run_dir)
    last = ""
    backend = for_executor(sub.plan.executor)
    while True:
        state = backend.live_state(sub)
        for tail in tails:
            for line in tail.new_lines():
                view.say(f"  [rank 0] {line}")
        if state is None:
            break
        if state != last:
            view.say(f"slurmddp: job {sub.job_id} {state} ({time.monotonic() - started:.0f}s)")
            last = state
        view.show(progress.line())
        time.sleep(poll_s)
    view.show(progress.line(), final=True)


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


class _Tail:
    """New complete lines of a file that may not exist yet, and may be replaced or cut short."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.partial = b""
        self.rewound = False
        """Whether the last `new_lines` started over, the file having been replaced or cut short."""

    def new_lines(self) -> list[str]:
        self.rewound = False
        try:
            with self.path.open("rb") as handle:
                stat = os.fstat(handle.fileno())
                # A shorter file was truncated in place; another inode replaced it by a rename.
                if stat.st_size < self.offset or self.inode not in (None, stat.st_ino):
                    self.rewound = True
                    self.offset, self.partial = 0, b""
                self.inode = stat.st_ino
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        # Bytes, split before decoding: a read may end inside a multi-byte character.
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]
