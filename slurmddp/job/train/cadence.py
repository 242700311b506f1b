"""How often in-memory snapshots are taken when `checkpoint.snapshot_every_steps` is unset: as often
as keeps their measured cost under BUDGET of the step time, aiming at AIM.

A snapshot costs the training the part it runs on the training path (the gather of the ranks' own
state and the copy of the shared state into CPU buffers, timed directly) plus what its write,
beside the training, takes from the steps it overlaps: nothing where the node has idle cores (a
GPU node), much where the ranks use them all (CPU ranks). That part is measured as the extra time
of the steps during which a write was in flight over the steps without one, times the steps a
write spans. Until both are known, the write's own time counts in full.

Pure: rank 0's loop feeds it the clock at each step boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUDGET = 0.01
"""The share of the step time snapshots may cost."""
AIM = BUDGET / 2
"""The share the interval is chosen for. The estimates it comes from are running means of step
times that swing by 10% on busy cores: an interval chosen for the budget itself would cost more
than the budget about half the time, at the price of half the steps redone after a crash."""
_EMA = 0.1


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + _EMA * (new - old)


@dataclass
class Cadence:
    every: int | None = None
    """A fixed interval (checkpoint.snapshot_every_steps), or None to choose one."""
    last: int = 0
    """The step of the newest state kept (snapshot, checkpoint or the start)."""
    idle_step_s: float | None = None
    """A step with no write in flight: the step time the budget is a share of."""
    busy_step_s: float | None = None
    """A step with this node's write in flight."""
    write_steps: float | None = None
    """Steps one write spans."""
    sync_s: float | None = None
    """A snapshot's part on the training path, a running mean: one snapshot's swings 1-5 ms on
    busy cores, and an interval chosen from the last alone swung 10-50 steps within a run."""
    write_s: float = 0.0
    """The last write's own duration, counted in full until the steps it slows are measured."""
    _tick: tuple[int, float, bool] | None = None
    _took = False
    _busy_run = 0
    _timed = 0
    """Snapshots whose part on the training path was timed."""
    _weight = 1.0
    """The weight of the last snapshot's part in sync_s: its part at the next boundary is added so."""

    def took(self, step: int, sync_s: float | None) -> None:
        """A snapshot (or a checkpoint, with sync_s None) kept the state after `step` steps."""
        self.last = step
        self._took = True
        if sync_s is not None:
            # The first snapshot's part holds one-off work (the CPU buffers allocated, the gather's
            # first use), which a mean of weight 0.1 would carry for dozens of snapshots: the
            # second replaces it, and the mean starts there.
            self._weight = 1.0 if self._timed < 2 else _EMA
            old = sync_s if self.sync_s is None else self.sync_s
            self.sync_s = old + self._weight * (sync_s - old)
            self._timed += 1

    def settled(self, seconds: float) -> None:
        """The last snapshot's part at the next boundary (waiting for the gather, starting the
        write) was on the training path too."""
        if self.sync_s is not None:
            self.sync_s += self._weight * seconds

    def cost_s(self) -> float | None:
        """What one snapshot costs the training; None before one was taken."""
        if self.sync_s is None:
            return None
        known = None not in (self.busy_step_s, self.idle_step_s, self.write_steps)
        if not known:
            return self.sync_s + self.write_s
        assert self.busy_step_s is not None and self.idle_step_s is not None and self.write_steps is not None
        return self.sync_s + max(0.0, self.busy_step_s - self.idle_step_s) * self.write_steps

    def interval(self) -> int:
        if self.every is not None:
            return self.every
        cost = self.cost_s()
        if cost is None or self.idle_step_s is None:
            # The first one as soon as a step was timed: its cost sets the interval.
            return 1
        return max(1, math.ceil(cost / (AIM * self.idle_step_s)))

    def worth_saying(self, said: int | None) -> bool:
        """Whether the interval has moved enough from the one last said (`said`; None: none yet)
        for the log to say it again: half or twice as many steps."""
        now = self.interval()
        return said is None or now >= 2 * said or 2 * now <= said

    def due_after(self, step: int, now: float, busy: bool, first_step: int, paused: bool = False) -> bool:
        """At the boundary before `step` (the clock `now`, this node's write in flight or not):
        should every rank take one at the next boundary, after `step + 1` steps? `paused`: the
        time since the last boundary holds more than steps (an epoch's validation, the next
        epoch's loader start)."""
        if self._tick is not None:
            last_step, last_at, was_busy = self._tick
            steps = max(1, step - last_step)
            # The resumed attempt's first step (slow), the steps that include a snapshot's own part
            # on the training path (timed apart) and a pause are not steps of either kind: an
            # epoch's validation timed as a step (0.5 s against 20 ms steps) skews whichever
            # estimate it lands in, and with it the interval.
            if step > first_step + 1 and not self._took and not paused:
                per_step = (now - last_at) / steps
                if was_busy:
                    self.busy_step_s = _ema(self.busy_step_s, per_step)
                else:
                    self.idle_step_s = _ema(self.idle_step_s, per_step)
            if was_busy:
                self._busy_run += steps
            if was_busy and not busy:
                self.write_steps = _ema(self.write_steps, self._busy_run)
                self._busy_run = 0
        self._took = False
        self._tick = (step, now, busy)
        return self.idle_step_s is not None and step + 1 - self.last >= self.interval()
