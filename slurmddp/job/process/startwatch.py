"""The start-up deadline's phases and its diagnosis (dist.start_timeout_s), kept pure; the
watchdog's thread (job/process/watchdog.py) keeps the time and writes the records.

A rank starts in phases: it loads torch and the user's module, meets the others at the rendezvous
store, forms the process group, runs the preflight, then the user's setup until its first steps.
The step watchdog only arms at the first step, and before it only dist.timeout_s (600 s) bounds
a rendezvous, while nothing bounds the user's setup: a dataset download that never ends, or a
barrier only some ranks reach, holds the allocation until its time limit. When the deadline
passes, every rank still starting reports its phase; the ranks that hold the others up are those
that never reached the rendezvous (rank 0's store saw who checked in), else those busy with work
of their own rather than waiting for their peers, else those that did not report at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

LOADING = "loading"
RENDEZVOUS = "rendezvous"
PROCESS_GROUP = "process group"
PREFLIGHT = "preflight"
SETUP = "setup"
FIRST_STEP = "first step"
WORDS = {
    LOADING: "loading torch and the entrypoint",
    RENDEZVOUS: "at the rendezvous",
    PROCESS_GROUP: "forming the process group",
    PREFLIGHT: "in the preflight check",
    SETUP: "in its setup before the first step",
    FIRST_STEP: "in its first steps",
}
"""What a rank in each phase is doing, in words."""
FIRST_STEPS = 3
"""The loop's steps a rank starts before its start-up is over: ctx.loop's third waits for the
stop flags every rank sent at its first (job/train/loop.py's boundary), so every rank is past its setup."""

# A script forms its own process group: where its main thread is says which phase it is in.
_TORCH_RENDEZVOUS = f"torch{os.sep}distributed{os.sep}rendezvous.py"
_TORCH_C10D = f"torch{os.sep}distributed{os.sep}distributed_c10d.py"


def phase_of(frame: FrameType | None, phase: str) -> str:
    """The phase a main thread at `frame` is in: torch's own rendezvous or init_process_group, where
    a script is inside one, else `phase`, what the rank said."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.endswith(_TORCH_RENDEZVOUS):
            return RENDEZVOUS
        if name.endswith(_TORCH_C10D) and frame.f_code.co_name == "init_process_group":
            return PROCESS_GROUP
        frame = frame.f_back
    return phase


def diagnose(
    reports: Sequence[Mapping[str, Any]], world_size: int, where: Sequence[str], limit_s: float
) -> tuple[str, str, list[str]]:
    """The start-up hang in words, the phase it is in, and the hosts of the ranks that hold it up."""
    by_rank = {int(r["rank"]): r for r in reports}
    # Rank 0's view of the store: the ranks that had checked in when it reported.
    arrived = by_rank.get(0, {}).get("arrived")
    stuck = [int(r["rank"]) for r in reports if not _waiting(r)]
    silent = [rank for rank in range(world_size) if rank not in by_rank]
    late = f"no first step {limit_s:.0f} s after the start (dist.start_timeout_s)"
    if arrived is not None and len(arrived) < world_size:
        culprits = [rank for rank in range(world_size) if rank not in arrived]
        phase = RENDEZVOUS
        said = {rank: f"never reached the rendezvous{_state(by_rank.get(rank), ': ')}" for rank in culprits}
    elif stuck:
        culprits = stuck
        phase = str(by_rank[stuck[0]]["phase"])
        said = {rank: f"hung{_state(by_rank[rank], ' ')}" for rank in culprits}
    elif silent:
        culprits = silent
        phase = "?"
        said = {rank: f"did not report{_state(None, '')}" for rank in culprits}
    else:
        phase = str(by_rank[min(by_rank)]["phase"]) if by_rank else "?"
        doing = WORDS.get(phase, phase)
        return (
            f"start-up hang {doing}: every rank waits for the others (different collectives?); {late}",
            phase,
            [],
        )
    names = "; ".join(f"rank {rank} on {_host(by_rank, where, rank)} {said[rank]}" for rank in culprits)
    return f"start-up hang: {names}; {late}", phase, [_host(by_rank, where, rank) for rank in culprits]


def _waiting(report: Mapping[str, Any]) -> bool:
    """Waiting for its peers: in a collective, or at the rendezvous and process group, which are
    all waiting (a rank that cannot reach the store is named by rank 0's view of it)."""
    return bool(report["waiting"]) or report["phase"] in (RENDEZVOUS, PROCESS_GROUP)


def _state(report: Mapping[str, Any] | None, then: str) -> str:
    """What a rank was doing and where, after `then`: `in its setup before the first step (in
    train.py:9 in train)`; with no report, why there may be none."""
    if report is None:
        return " (no report: its process is stuck, gone or never started)"
    phase = str(report["phase"])
    return f"{then}{WORDS.get(phase, phase)} (in {report['where']})"


def _host(by_rank: Mapping[int, Mapping[str, Any]], where: Sequence[str], rank: int) -> str:
    if rank in by_rank:
        return str(by_rank[rank]["host"])
    return where[rank] if rank < len(where) else "?"
