"""A quickstart run on the lab as the campaign watches it: how far it trained, its attempts, the
processes of its ranks, and its complete checkpoints (checked as the loop checks them at load:
sizes and CRC32 against every rank's marker)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from slurmddp.job.checkpoint.integrity import STEP_DIR_RE, checkpoint_problems
from slurmddp.rundir.records import Begin, End, final_end, read_attempts


class FaultMissed(RuntimeError):
    """The run ended (or never got) where the fault was to be injected."""


def last_step(run: Path) -> int:
    """The last step rank 0 logged (train.log_every=1 logs each); -1 before the first."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return -1
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return -1


def step_times(run: Path) -> list[tuple[int, float]]:
    """(step, unix time) of every record in metrics.jsonl: what the attempts that count logged."""
    found = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found.append((int(record["step"]), float(record["time"])))
    return found


def begins(run: Path) -> list[Begin]:
    return [event for event in read_attempts(run) if isinstance(event, Begin)]


def ends(run: Path) -> list[End]:
    return [event for event in read_attempts(run) if isinstance(event, End)]


def ended(run: Path) -> bool:
    return final_end(read_attempts(run)) is not None


def wait_for(what: str, check: Callable[[], bool], run: Path, timeout: float = 180) -> None:
    """Poll `check` every 20 ms, or 4 times its own length where it runs a command (squeue: every
    20 ms took most of a core from the runs); FaultMissed when the run ended first or `timeout`
    passed."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        if check():
            return
        if ended(run):
            raise FaultMissed(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise FaultMissed(f"no {what} after {timeout:.0f} s")
        time.sleep(max(0.02, 4 * (time.monotonic() - began)))


def wait_for_step(run: Path, step: int) -> None:
    wait_for(f"step {step}", lambda: last_step(run) >= step, run)


class CheckpointLedger:
    """Every checkpoint of a run seen complete (sizes and CRC32 as at load), polled while it runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: set[int] = set()
        # A directory is checked again only when one of its files changed (size or mtime).
        self._checked: dict[tuple[object, ...], bool] = {}

    def complete(self) -> set[int]:
        """The steps of the checkpoints complete right now."""
        found = set()
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return found
        for entry in entries:
            match = STEP_DIR_RE.match(entry.name)
            if match is None:
                continue
            step = int(match.group(1))
            try:
                key = (
                    step,
                    *sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in entry.iterdir()),
                )
            except OSError:
                continue
            if key not in self._checked:
                self._checked[key] = not checkpoint_problems(entry, step, None, check_crc=True)
            if self._checked[key]:
                found.add(step)
        return found

    def poll(self) -> None:
        self.seen |= self.complete()

    def lost(self, keep_last: int, damaged_on_purpose: frozenset[int]) -> list[int]:
        """Complete checkpoints gone at the end that pruning does not explain (it deletes one only
        once `keep_last` newer ones were complete); the ones the fault itself damaged (complete
        until then) do not count."""
        final = self.complete()
        self.seen |= final | damaged_on_purpose
        return sorted(
            step
            for step in self.seen - final - damaged_on_purpose
            if sum(1 for newer in self.seen if newer > step) < keep_last
        )
