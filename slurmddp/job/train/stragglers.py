"""A slow node, named while the run goes: under DDP every rank waits for the slowest at each
gradient all-reduce, so one node that computes slower (a throttled GPU, a CPU quota, a noisy
neighbour) slows every step of every rank, and goodput is lost on all of them.

The telemetry's figures (job/train/telemetry.py) tell it: a rank's time outside communication
(its step time less the time its buckets were in flight, `step_s - comm_s`) is its own compute and
data wait, while the time it spends waiting for the others is in `comm_s`. The slowest rank waits
for nobody. A node is as slow as its slowest rank; one whose compute stays at least SLOW_RATIO x
the median node's for most of the last SLOW_FOR_S is named in rank 0's log and in
RUN_DIR/slow_node.json, which `status` shows, with how much of each step it costs."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

SLOW_RATIO = 1.3
"""A node this many times the median node's compute per step is slow."""
SLOW_FOR_S = 30.0
"""...when it stays so over this span (telemetry records come every telemetry.every_s)..."""
NAME_SHARE = 0.8
"""...in records covering this share of the span or more: one noisy record (a neighbour's burst on
another node, a collective that ran late) must not start the count again, and a pause of a few
seconds (a garbage collection, a checkpoint) must not name a node."""
CLEAR_SHARE = 0.5
"""A named node is no longer slow when its share falls under this: between the two, it stays named
rather than being named and cleared on alternate records."""


@dataclass(frozen=True)
class Straggler:
    node: int
    """The node's index in the step (SLURM_NODEID)."""
    ratio: float
    """Its compute per step over the median node's."""
    slows_by: float
    """The share of each step it costs: what a step would lose if the node kept the median's pace."""


def slowest_node(compute_s: Sequence[float], nodes: Sequence[int], step_s: float) -> Straggler | None:
    """The node whose ranks' compute per step (`compute_s`, by rank; `nodes`: each rank's node)
    is SLOW_RATIO x the median node's or more; None where none is, or the run has one node."""
    per_node: dict[int, float] = {}
    for node, seconds in zip(nodes, compute_s, strict=True):
        per_node[node] = max(per_node.get(node, 0.0), seconds)
    if len(per_node) < 2 or step_s <= 0:
        return None
    median = statistics.median(per_node.values())
    node, worst = max(per_node.items(), key=lambda item: item[1])
    if median <= 0 or worst < SLOW_RATIO * median:
        return None
    return Straggler(node, worst / median, min(1.0, (worst - median) / step_s))


class Watch:
    """Rank 0: whether one node stayed slow over the last SLOW_FOR_S, from the telemetry's records."""

    def __init__(self) -> None:
        self._records: deque[tuple[float, float, Straggler | None]] = deque()
        self.named: Straggler | None = None
        """The node named slow now, as the newest record that found it slow measured it; None
        while none is."""

    def seen(self, found: Straggler | None, window_start: float, now: float) -> bool:
        """One record's verdict (`found`, over the steps from `window_start` to `now`, monotonic);
        whether the node named slow changed (named, or recovered)."""
        span_start = now - SLOW_FOR_S
        self._records.append((window_start, now, found))
        while len(self._records) > 1 and self._records[1][0] <= span_start:
            self._records.popleft()
        if self._records[0][0] > span_start:
            return False  # the records do not cover the span yet
        before = self.named
        if before is not None:
            if found is not None and found.node == before.node:
                self.named = found
            elif self._share(before.node, span_start) < CLEAR_SHARE:
                self.named = None
        elif found is not None and self._share(found.node, span_start) >= NAME_SHARE:
            self.named = found
        return (before is None) != (self.named is None)

    def _share(self, node: int, span_start: float) -> float:
        """The share of the span from `span_start` covered by records that found `node` slow."""
        slow = sum(
            end - max(start, span_start)
            for start, end, found in self._records
            if found is not None and found.node == node
        )
        return slow / SLOW_FOR_S
