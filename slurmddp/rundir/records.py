"""What the run directory holds, as typed records: one class a file, each with one read and one
write. The batch script, the ranks and the login-node commands each read what another wrote, so
the JSON keys are the contract: they stay as runs written by earlier versions have them.

    progress.json   Progress     rank 0: how far the attempt got
    skipped_checkpoints.json  SkippedSaves  rank 0: checkpoints not saved for want of space
    slow_node.json  SlowNode  rank 0: the node slowing every step, or none
    stop.json       Stop         rank 0: where the ranks stopped after a stop signal
    failure.json    Failure      a rank's crash, a hang, a failed preflight, a refused job
    interrupt.json  Interrupt    `slurmddp interrupt`: the reason its signal stands for
    attempts.jsonl  Begin, End, Resubmit: every attempt's begin and end, and each resubmit
    excluded.json   Exclusions   hosts the run leaves out, and why: for the run, or for one allocation
    unwatched/      Unwatched    a rank whose peer watch could not start or stopped: one file a rank
    result.json     completed_by: whether an attempt's ranks all returned (job/launch/runtime.py writes it)

Records of one attempt name it (AttemptId): a file left by an earlier attempt is not this one's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from slurmddp.defaults import IN_JOB_RESTART_ENV, EndReason, RequeueReason
from slurmddp.files import read_json_object, write_json
from slurmddp.rundir.layout import (
    ATTEMPTS,
    CONFIG,
    EXCLUDED,
    FAILURE,
    INTERRUPT,
    PROGRESS,
    RESULT,
    SKIPPED_SAVES,
    SLOW_NODE,
    STOP,
    SWEEP,
    UNWATCHED,
)

CANCELLED: EndReason = "cancelled"
"""The reason `slurmddp cancel` records: final, and never requeued."""


def in_job_restart(env: Mapping[str, str]) -> int:
    """The batch script's count of restarts inside this allocation (0 outside a batch script)."""
    return int(env.get(IN_JOB_RESTART_ENV) or 0)


class Placed(Protocol):
    """What a rank knows of its attempt (a DistEnv): the rank's environment lives above the records."""

    @property
    def job_id(self) -> str: ...
    @property
    def restart_count(self) -> int: ...
    @property
    def in_job_restart(self) -> int: ...


@dataclass(frozen=True)
class AttemptId:
    """One attempt of a job: Slurm keeps the job id across requeues and counts the restarts; the
    batch script counts the restarts inside one allocation (IN_JOB_RESTART_ENV)."""

    job_id: str
    restart_count: int
    in_job_restart: int = 0
    """Restarts before this attempt in the same allocation, each a new srun step."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AttemptId:
        return cls(
            env.get("SLURM_JOB_ID", ""),
            int(env.get("SLURM_RESTART_COUNT") or 0),
            in_job_restart(env),
        )

    @classmethod
    def of(cls, dist: Placed) -> AttemptId:
        """The attempt a rank belongs to."""
        return cls(dist.job_id, dist.restart_count, dist.in_job_restart)

    @property
    def allocation(self) -> str:
        """The allocation this attempt runs in, "JOB.RESTART_COUNT": every in-job restart of it
        shares it, and a requeue starts another."""
        return f"{self.job_id}.{self.restart_count}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptId:
        return cls(
            str(data.get("job_id", "")),
            int(data.get("restart_count") or 0),
            int(data.get("in_job_restart") or 0),
        )

    def to_json(self) -> dict[str, Any]:
        # Without the key where 0: the records of runs without in-job restarts keep their shape.
        more = {"in_job_restart": self.in_job_restart} if self.in_job_restart else {}
        return {"job_id": self.job_id, "restart_count": self.restart_count, **more}

    def wrote(self, data: Mapping[str, Any]) -> bool:
        """Whether this attempt wrote the record `data` (a record without the keys is nobody's)."""
        return (
            str(data.get("job_id")) == self.job_id
            and data.get("restart_count") == self.restart_count
            and int(data.get("in_job_restart") or 0) == self.in_job_restart
        )


def _without_none(data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a writer filled: where two writers of a file differ, each leaves the other's out."""
    return {key: value for key, value in data.items() if value is not None}


def completed_by(run_dir: Path, attempt: AttemptId) -> bool:
    """Whether `attempt` wrote result.json: every rank returned from the function."""
    data = read_json_object(run_dir / RESULT)
    return data is not None and attempt.wrote(data)


@dataclass(frozen=True)
class LoopProgress:
    """What ctx.loop knows besides the step (a script rank knows only its step count)."""

    total_steps: int | None
    epoch: int | None
    epochs: int | None
    last_save_s: float
    global_batch: int | None
    """What a resubmit onto another number of ranks must split (ctx.loader's)."""


@dataclass(frozen=True)
class Phases:
    """Where an attempt's time went, as its rank 0 saw it: kept in progress.json as it goes, and
    copied into the attempt's end record, from which `status` works out the run's goodput."""

    started_step: int
    """The step the attempt started from (0, or the checkpoint it resumed)."""
    first_step_at: float | None
    """When its first step ended (Unix time); None: it made none."""
    last_step_at: float
    """When it last recorded its step (progress.json's time)."""
    save_s: float = 0.0
    """Seconds its checkpoint saves held the training up (the ranks' part of an async save)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "started_step": self.started_step,
            "first_step_at": self.first_step_at,
            "last_step_at": self.last_step_at,
            "save_s": round(self.save_s, 3),
        }

    @classmethod
    def from_json(cls, data: Any) -> Phases | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("started_step"), int):
            return None
        first = data.get("first_step_at")
        return cls(
            data["started_step"],
            None if first is None else float(first),
            float(data.get("last_step_at") or 0.0),
            float(data.get("save_s") or 0.0),
        )


@dataclass(frozen=True)
class Progress:
    """progress.json, refreshed by rank 0 every few seconds."""

    step: int
    attempt: AttemptId
    time: float
    loop: LoopProgress | None = None
    started_step: int | None = None
    """The step this attempt started from; None in runs of versions before it."""
    first_step_at: float | None = None
    """When this attempt's first step ended; None before it (or in older runs)."""
    save_s: float = 0.0
    """Seconds this attempt's checkpoint saves held the training up so far."""

    @property
    def phases(self) -> Phases | None:
        if self.started_step is None:
            return None
        return Phases(self.started_step, self.first_step_at, self.time, self.save_s)

    @classmethod
    def read(cls, run_dir: Path) -> Progress | None:
        data = read_json_object(run_dir / PROGRESS)
        if data is None or not isinstance(data.get("step"), int):
            return None
        loop = None
        # last_save_s: the loop's from the first version on; total_steps and epochs came later.
        if "last_save_s" in data or "total_steps" in data:
            loop = LoopProgress(
                data.get("total_steps"),
                data.get("epoch"),
                data.get("epochs"),
                float(data.get("last_save_s") or 0.0),
                data.get("global_batch"),
            )
        phases = Phases.from_json(data)
        return cls(
            data["step"],
            AttemptId.from_json(data),
            float(data.get("time") or 0.0),
            loop,
            None if phases is None else phases.started_step,
            None if phases is None else phases.first_step_at,
            0.0 if phases is None else phases.save_s,
        )

    def write(self, run_dir: Path) -> None:
        loop = {} if self.loop is None else vars(self.loop)
        phases = {} if self.phases is None else self.phases.to_json()
        phases.pop("last_step_at", None)  # the record's own time
        write_json(
            run_dir / PROGRESS,
            {"step": self.step, "time": self.time, **loop, **phases, **self.attempt.to_json()},
        )


@dataclass(frozen=True)
class SlowNode:
    """slow_node.json: the node rank 0's telemetry found slowing every step (job/train/stragglers.py),
    or, with `host` None, that none is now."""

    host: str | None
    ratio: float
    """Its ranks' compute per step over the median node's."""
    slows_by: float
    """The share of each step it costs."""
    step: int
    attempt: AttemptId
    time: float

    @classmethod
    def read(cls, run_dir: Path) -> SlowNode | None:
        data = read_json_object(run_dir / SLOW_NODE)
        if data is None or "host" not in data:
            return None
        host = data.get("host")
        return cls(
            None if host is None else str(host),
            float(data.get("ratio") or 0.0),
            float(data.get("slows_by") or 0.0),
            int(data.get("step") or 0),
            AttemptId.from_json(data),
            float(data.get("time") or 0.0),
        )

    def write(self, run_dir: Path) -> None:
        record = {"host": self.host, "ratio": round(self.ratio, 3), "slows_by": round(self.slows_by, 4)}
        write_json(
            run_dir / SLOW_NODE, {**record, "step": self.step, "time": self.time, **self.attempt.to_json()}
        )


@dataclass(frozen=True)
class SkippedSaves:
    """skipped_checkpoints.json: the checkpoints rank 0's loop skipped because they did not fit
    (job/checkpoint/space.py), counted over the run, with the latest one's step and why."""

    count: int
    step: int
    """The latest skipped checkpoint's step."""
    why: str
    """The latest skip's reason, as the ranks agreed on it."""
    attempt: AttemptId
    time: float

    @classmethod
    def read(cls, run_dir: Path) -> SkippedSaves | None:
        data = read_json_object(run_dir / SKIPPED_SAVES)
        if data is None or not isinstance(data.get("count"), int):
            return None
        return cls(
            data["count"],
            int(data.get("step") or 0),
            str(data.get("why", "")),
            AttemptId.from_json(data),
            float(data.get("time") or 0.0),
        )

    @classmethod
    def add(cls, run_dir: Path, step: int, why: str, attempt: AttemptId, now: float) -> SkippedSaves:
        """Count one more skipped checkpoint (rank 0 is the one writer); the record written."""
        before = cls.read(run_dir)
        record = cls((before.count if before is not None else 0) + 1, step, why, attempt, now)
        write_json(
            run_dir / SKIPPED_SAVES,
            {"count": record.count, "step": step, "why": why, "time": now, **attempt.to_json()},
        )
        return record


@dataclass(frozen=True)
class Stop:
    """stop.json: rank 0 after a stop signal, once every rank stopped."""

    step: int | None
    """The loop's step; None for a script rank, whose steps are the script's."""
    signal: str
    signal_at: float | None
    attempt: AttemptId
    time: float
    save_s: float | None = None
    """ctx.loop: how long the stop's checkpoint took."""
    script_status: int | None = None
    """A script rank: the script's exit status after the SIGTERM passed on to it."""

    @classmethod
    def read_for(cls, run_dir: Path, attempt: AttemptId) -> Stop | None:
        """The stop of `attempt`; None when this attempt was not told to stop."""
        data = read_json_object(run_dir / STOP)
        if data is None or not attempt.wrote(data):
            return None
        return cls(
            data.get("step"),
            str(data.get("signal", "a stop signal")),
            data.get("signal_at"),
            attempt,
            float(data.get("time") or 0.0),
            data.get("save_s"),
            data.get("script_status"),
        )

    def write(self, run_dir: Path) -> None:
        fields = {"save_s": self.save_s, "script_status": self.script_status}
        write_json(
            run_dir / STOP,
            {
                "step": self.step,
                "signal": self.signal,
                "signal_at": self.signal_at,
                "time": self.time,
                **_without_none(fields),
                **self.attempt.to_json(),
            },
        )


@dataclass(frozen=True)
class CodeSite:
    """A line of the user's code: where an exception came from."""

    file: str
    line: int
    function: str

    @classmethod
    def from_json(cls, data: Any) -> CodeSite | None:
        if not isinstance(data, dict) or not isinstance(data.get("line"), int):
            return None
        return cls(str(data.get("file", "")), data["line"], str(data.get("function", "")))


@dataclass(frozen=True)
class Failure:
    """failure.json: why the attempt failed, for the failure budget and the hosts to leave out.
    Each attempt's failure replaces the one before, which it keeps under `earlier`, so `status`
    can say why every attempt failed."""

    step: int | None
    rank: int
    error: str
    """repr() of the exception (or what else failed): what the requeue policy reads."""
    attempt: AttemptId
    time: float
    bad_hosts: dict[str, str] | None = None
    """Hosts confirmed broken, with why (a failed preflight or device check, a device's own error,
    a host that stopped answering even a new connection): the run goes on without them."""
    retry: bool | None = None
    """False: the same job would fail the same way (a refused pickle, a failed preflight)."""
    cause: str | None = None
    """The watchdog's diagnosis of a hang."""
    hang_dir: str | None = None
    exception: str | None = None
    """The exception's type name, where a Python exception ended the rank."""
    message: str | None = None
    """The exception's own text, without its type."""
    where: CodeSite | None = None
    """The innermost frame of the user's own code (not Python's, a library's or slurmddp's)."""
    suspect_hosts: dict[str, str] | None = None
    """Hosts whose every rank died while other nodes' ranks lived on (job/process/peerwatch.py), or those a
    hang's diagnosis blames (job/process/watchdog.py): likely, not proven, broken; a spare node takes their
    place for the rest of the allocation where one is left, else they stay."""
    exit_status: int | None = None
    """A script rank: the status the script exited with (negative: the signal that ended it),
    which tells one script failure from another where no Python exception reached slurmddp."""

    @classmethod
    def read_for(cls, run_dir: Path, attempt: AttemptId) -> Failure | None:
        """The failure of `attempt`; None when it recorded none."""
        data = read_json_object(run_dir / FAILURE)
        if data is None or not attempt.wrote(data):
            return None
        return cls._from_json(data)

    @classmethod
    def read_all(cls, run_dir: Path) -> list[Failure]:
        """Every attempt's failure, oldest first."""
        data = read_json_object(run_dir / FAILURE)
        if data is None:
            return []
        earlier = data.get("earlier")
        older = (
            [cls._from_json(item) for item in earlier if isinstance(item, dict)]
            if isinstance(earlier, list)
            else []
        )
        return [*older, cls._from_json(data)]

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> Failure:
        return cls(
            data.get("step"),
            int(data.get("rank") or 0),
            str(data.get("error", "")),
            AttemptId.from_json(data),
            float(data.get("time") or 0.0),
            data.get("bad_hosts"),
            data.get("retry"),
            data.get("cause"),
            data.get("hang_dir"),
            data.get("exception"),
            data.get("message"),
            CodeSite.from_json(data.get("where")),
            data.get("suspect_hosts"),
            data.get("exit_status"),
        )

    def to_json(self) -> dict[str, Any]:
        optional = {
            "bad_hosts": self.bad_hosts,
            "retry": self.retry,
            "cause": self.cause,
            "hang_dir": self.hang_dir,
            "exception": self.exception,
            "message": self.message,
            "where": None if self.where is None else vars(self.where),
            "suspect_hosts": self.suspect_hosts,
            "exit_status": self.exit_status,
        }
        return {
            "step": self.step,
            "rank": self.rank,
            "error": self.error,
            "time": self.time,
            **_without_none(optional),
            **self.attempt.to_json(),
        }

    def write(self, run_dir: Path, *, replace: bool = False) -> bool:
        """Write it unless this attempt recorded a failure already; whether it was written. The
        first record of an attempt stands: what crashed first is the cause, and the errors of the
        ranks it left behind ("Connection closed by peer") are consequences. `replace`: a verdict
        that outranks any of those (the watchdog's diagnosis of a hang, a failed preflight, which
        runs before any step)."""
        if not replace and Failure.read_for(run_dir, self.attempt) is not None:
            return False
        before = read_json_object(run_dir / FAILURE) or {}
        earlier = before.pop("earlier", [])
        if before and not self.attempt.wrote(before):
            earlier = [*earlier, before]
        write_json(run_dir / FAILURE, {**self.to_json(), **({"earlier": earlier} if earlier else {})})
        return True


@dataclass(frozen=True)
class Interrupt:
    """interrupt.json: `slurmddp interrupt` sent the stop signal, as a preemption or a timeout."""

    reason: RequeueReason
    attempt: AttemptId

    @classmethod
    def read_for(cls, run_dir: Path, attempt: AttemptId) -> Interrupt | None:
        data = read_json_object(run_dir / INTERRUPT)
        if data is None or not attempt.wrote(data):
            return None
        return cls(cast(RequeueReason, data["reason"]), attempt)

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / INTERRUPT, {"reason": self.reason, **self.attempt.to_json()})


@dataclass(frozen=True)
class Begin:
    """attempts.jsonl: the batch script (a local run's rank 0) starts an attempt."""

    attempt: int
    time: float
    host: str
    nodes: str
    """The job's nodes (SLURM_JOB_NODELIST), in Slurm's host list syntax."""
    attempt_id: AttemptId

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "begin",
            "attempt": self.attempt,
            "time": self.time,
            "host": self.host,
            "nodes": self.nodes,
            **self.attempt_id.to_json(),
        }


@dataclass(frozen=True)
class End:
    """attempts.jsonl: how an attempt ended, and whether the job went around again."""

    reason: EndReason
    step: int | None
    time: float
    requeue: bool
    final: bool
    message: str
    attempt: int | None = None
    """None: a cancel, which ends the run rather than one attempt."""
    status: int | None = None
    """srun's exit status (a local run: its rank 0's); None where nobody saw it end."""
    attempt_id: AttemptId | None = None
    """None where written from outside the attempt (a cancel, an attempt found killed)."""
    in_job: bool = False
    """Went around again as a new step of the same allocation, not through the queue."""
    signature: str | None = None
    """A failure: what failed (job/allocation/requeue.py's `signature`), which the next attempt's failure is
    compared with; None for other ends, and in runs of versions before it."""
    phases: Phases | None = None
    """Where the attempt's time went (its progress.json when it ended); None where its rank 0
    recorded none (it never started training, or a version before it)."""

    def to_json(self) -> dict[str, Any]:
        known = {
            "attempt": self.attempt,
            "status": self.status,
            "in_job": self.in_job or None,
            "signature": self.signature,
            "phases": None if self.phases is None else self.phases.to_json(),
        }
        return {
            "event": "end",
            "reason": self.reason,
            "step": self.step,
            "time": self.time,
            "requeue": self.requeue,
            "final": self.final,
            "message": self.message,
            **_without_none(known),
            **(self.attempt_id.to_json() if self.attempt_id is not None else {}),
        }


@dataclass(frozen=True)
class Resubmit:
    """attempts.jsonl: `slurmddp resubmit` submitted the run again: its budgets start afresh."""

    time: float
    argv: list[str]
    changed: list[str] | None = None
    """A single run's resubmit: the config keys it changed."""
    ranks: list[int] | None = None
    """A single run's resubmit: the number of ranks before and after."""

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "resubmit",
            "time": self.time,
            "argv": self.argv,
            **_without_none({"changed": self.changed, "ranks": self.ranks}),
        }


AttemptEvent = Begin | End | Resubmit


def _event(data: Mapping[str, Any]) -> AttemptEvent:
    if data["event"] == "begin":
        return Begin(
            int(data.get("attempt") or 0),
            float(data["time"]),
            str(data.get("host", "")),
            str(data.get("nodes") or ""),
            AttemptId.from_json(data),
        )
    if data["event"] == "end":
        return End(
            cast(EndReason, data["reason"]),
            data.get("step"),
            float(data.get("time") or 0.0),
            bool(data.get("requeue")),
            bool(data.get("final")),
            str(data.get("message", "")),
            data.get("attempt"),
            data.get("status"),
            AttemptId.from_json(data) if "job_id" in data else None,
            bool(data.get("in_job")),
            data.get("signature"),
            Phases.from_json(data.get("phases")),
        )
    return Resubmit(
        float(data.get("time") or 0.0), list(data.get("argv", [])), data.get("changed"), data.get("ranks")
    )


def read_attempts(run_dir: Path) -> list[AttemptEvent]:
    path = run_dir / ATTEMPTS
    if not path.is_file():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        # A line being appended as this reads (a local rank starting while its rank 0 records the
        # attempt's begin): not there yet.
        text = text[: text.rfind("\n") + 1]
    return [_event(json.loads(line)) for line in text.splitlines() if line.strip()]


def append_attempt(run_dir: Path, event: AttemptEvent) -> None:
    """Add a line: appended and fsynced, never rewritten (the batch script and `cancel` may write
    at once)."""
    with (run_dir / ATTEMPTS).open("a") as handle:
        handle.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def current(events: Sequence[AttemptEvent]) -> list[AttemptEvent]:
    """The records since the last resubmit: a resubmitted run starts with fresh budgets."""
    marks = [i for i, event in enumerate(events) if isinstance(event, Resubmit)]
    return list(events[marks[-1] + 1 :] if marks else events)


def begins(events: Sequence[AttemptEvent]) -> list[Begin]:
    return [event for event in events if isinstance(event, Begin)]


def ends(events: Sequence[AttemptEvent]) -> list[End]:
    return [event for event in events if isinstance(event, End)]


def latest_of_allocation(events: Sequence[AttemptEvent], me: AttemptId) -> AttemptId:
    """`me`, or the latest attempt begun in its allocation where that is a later one: the batch
    script counts its own restarts (IN_JOB_RESTART_ENV), and a resident launcher
    (job/launch/resident.py) restarts in the step without it."""
    later = [
        b.attempt_id
        for b in begins(events)
        if b.attempt_id.allocation == me.allocation and b.attempt_id.in_job_restart > me.in_job_restart
    ]
    return max(later, key=lambda attempt: attempt.in_job_restart, default=me)


def local_attempt(events: Sequence[AttemptEvent], job_id: str) -> AttemptId:
    """The attempt of local job `job_id` that starts (or runs) now. submitit's local controller
    counts no restarts: it starts every task again once all of the previous attempt's have exited,
    rank 0 having recorded that attempt's end, so every rank of an attempt counts the same ends.
    A resubmitted run is a new job, counted from 0 again."""
    ended = [e for e in ends(current(events)) if e.attempt_id is not None and e.attempt_id.job_id == job_id]
    return AttemptId(job_id, len(ended))


def running_attempt(events: Sequence[AttemptEvent], allocation: AttemptId) -> AttemptId:
    """The attempt that runs now in `allocation` (the job id and restart count Slurm shows): its
    newest begin, which counts the in-job restarts Slurm does not see."""
    same = [
        b.attempt_id
        for b in begins(events)
        if (b.attempt_id.job_id, b.attempt_id.restart_count) == (allocation.job_id, allocation.restart_count)
    ]
    return same[-1] if same else allocation


def attempt_number(events: Sequence[AttemptEvent], me: AttemptId) -> int:
    """Which attempt of the run `me` is, counted from 1 over every job the run had (resubmits
    included): the place of its begin among the run's, or the next one where its begin is not
    recorded yet (a local run's rank 0 records it as its ranks start). What users read; the
    records keep their own count (`Begin.attempt`, from 0)."""
    started = begins(events)
    mine = [n for n, begin in enumerate(started, start=1) if begin.attempt_id == me]
    return mine[-1] if mine else len(started) + 1


def final_end(events: Sequence[AttemptEvent]) -> End | None:
    """The record that ended the run for good (completed, cancelled, out of budget), if any."""
    found = ends(current(events))
    return found[-1] if found and found[-1].final else None


@dataclass(frozen=True)
class Exclusion:
    reason: str
    attempt: int
    time: float
    allocation: str | None = None
    """Left out of this allocation only (AttemptId.allocation): suspected, not confirmed, so a
    requeue or a resubmit may give it ranks again. None: left out for the rest of the run."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Exclusion:
        allocation = data.get("allocation")
        return cls(
            str(data["reason"]),
            int(data.get("attempt") or 0),
            float(data.get("time") or 0.0),
            None if allocation is None else str(allocation),
        )

    def to_json(self) -> dict[str, Any]:
        return _without_none(vars(self))


@dataclass(frozen=True)
class Exclusions:
    """excluded.json: the hosts this run leaves out, oldest first.

    A host is in one of two maps. `hosts`: confirmed (Slurm saw it go down, a check or its device
    said so), left out of every later attempt, of the requeue's ExcNodeList and of a resubmit.
    `set_aside`: only suspected (its ranks died together; a hang blamed it), left out of the
    restarts of the allocation it names, so one runs on a spare instead; the next allocation may
    hold it again. Two keys in the file, not a mark on one map's entries: a slurmddp from before
    the split reads only `hosts`, and so never leaves a suspect out for good."""

    hosts: dict[str, Exclusion] = field(default_factory=dict)
    set_aside: dict[str, Exclusion] = field(default_factory=dict)

    @classmethod
    def read(cls, run_dir: Path) -> Exclusions:
        data = read_json_object(run_dir / EXCLUDED) or {}
        return cls(_exclusions(data.get("hosts")), _exclusions(data.get("set_aside")))

    def adding(self, found: Mapping[str, str], attempt: int, now: float) -> Exclusions:
        """These and the hosts `found` (with why), left out from attempt `attempt` on for good; a
        suspect confirmed is set aside no longer."""
        set_aside = {host: why for host, why in self.set_aside.items() if host not in found}
        return Exclusions(
            {**self.hosts, **{host: Exclusion(why, attempt, now) for host, why in found.items()}}, set_aside
        )

    def setting_aside(
        self, found: Mapping[str, str], attempt: int, now: float, allocation: str
    ) -> Exclusions:
        """These and the hosts `found` (with why), left out of `allocation` from attempt `attempt`
        on; one set aside in an earlier allocation takes this one's."""
        fresh = {host: Exclusion(why, attempt, now, allocation) for host, why in found.items()}
        return Exclusions(self.hosts, {**self.set_aside, **fresh})

    def applying_to(self, attempt: AttemptId) -> dict[str, Exclusion]:
        """The hosts `attempt` runs without: those left out for good, and those set aside in its
        allocation."""
        here = {
            host: why
            for host, why in self.set_aside.items()
            if why.allocation == attempt.allocation and host not in self.hosts
        }
        return {**self.hosts, **here}

    def write(self, run_dir: Path) -> None:
        data = {"hosts": {host: why.to_json() for host, why in self.hosts.items()}}
        if self.set_aside:
            data["set_aside"] = {host: why.to_json() for host, why in self.set_aside.items()}
        write_json(run_dir / EXCLUDED, data)


def _exclusions(data: Any) -> dict[str, Exclusion]:
    if not isinstance(data, dict):
        return {}
    return {str(host): Exclusion.from_json(why) for host, why in data.items() if isinstance(why, dict)}


@dataclass(frozen=True)
class Unwatched:
    """unwatched/rank_N.json: a rank whose peer watch could not start or stopped (job/process/peerwatch.py),
    so a death without a word that the watch would have told in a second is found only by srun and
    the collectives' timeouts. One file a rank, not one file for all: a broken store fails every
    rank's watch at once, and a read-merge-rename of one file by several writers keeps only the
    last one's read (a rank's words lost, not merely replaced by its own later ones)."""

    rank: int
    what: str
    """What happened, completing "rank N's peer watch ...": "stopped (OSError(...))"."""
    attempt: AttemptId
    time: float

    @classmethod
    def read_for(cls, run_dir: Path, attempt: AttemptId) -> list[Unwatched]:
        """The ranks of `attempt` whose watch could not start or stopped, by rank."""
        found = []
        for path in (run_dir / UNWATCHED).glob("rank_*.json"):
            data = read_json_object(path)
            if data is not None and attempt.wrote(data) and isinstance(data.get("rank"), int):
                found.append(
                    cls(data["rank"], str(data.get("what", "")), attempt, float(data.get("time") or 0.0))
                )
        return sorted(found, key=lambda unwatched: unwatched.rank)

    def write(self, run_dir: Path) -> None:
        """Replaces what this rank wrote in an earlier attempt: only the attempt's own is read."""
        data = {"rank": self.rank, "what": self.what, "time": self.time, **self.attempt.to_json()}
        write_json(run_dir / UNWATCHED / f"rank_{self.rank}.json", data)


def run_dir_of(folder: Path, env: Mapping[str, str]) -> Path | None:
    """The run directory of the job whose submitit folder is `folder` (RUN_DIR/logs, or a sweep's
    SWEEP_DIR/logs, where the array task's own element is looked up by its job id); None when it
    cannot be told (a submission whose job id is not recorded yet)."""
    parent = folder.parent
    if (parent / SWEEP).is_file():
        manifest = json.loads((parent / SWEEP).read_text())
        job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
        numbers = [n for n, s in enumerate(manifest["submissions"]) if str(s.get("job_id")) == job]
        return element_dir(parent, numbers[0], env) if numbers else None
    return parent if (parent / CONFIG).is_file() else None


def element_dir(sweep_dir: Path, submission: int, env: Mapping[str, str]) -> Path:
    """The run directory of the element this array task runs (a one-element submission is a
    plain job, without SLURM_ARRAY_TASK_ID)."""
    manifest = json.loads((sweep_dir / SWEEP).read_text())
    position = int(env.get("SLURM_ARRAY_TASK_ID") or 0)
    index = manifest["submissions"][submission]["elements"][position]
    return sweep_dir / str(manifest["elements"][index]["dir"])
