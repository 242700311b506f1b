"""What was submitted, read back from run directories and the cluster alone.

Everything `status`, `logs`, `cancel`, `resubmit` and `results` need is in the run (or sweep)
directory plus squeue/sacct, so they work from a new shell on any login node.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import JobState
from slurmddp.defaults import EndReason, RunExecutor, RunKind
from slurmddp.errors import SlurmddpError
from slurmddp.job.checkpoint.completeness import newest_complete
from slurmddp.job.checkpoint.integrity import checkpoint_problems, step_dirs
from slurmddp.manage import accounting, goodput, index, numbers
from slurmddp.manage.backend import Backend, for_manifest
from slurmddp.manage.goodput import Goodput
from slurmddp.rundir.config import checkpoint_dir, spare_share
from slurmddp.rundir.layout import MANIFEST, PERF, SWEEP
from slurmddp.rundir.manifest import RunManifest, SweepManifest
from slurmddp.rundir.metrics import latest_values, read_metrics
from slurmddp.rundir.records import (
    AttemptEvent,
    AttemptId,
    Begin,
    End,
    Exclusion,
    Exclusions,
    Progress,
    SkippedSaves,
    SlowNode,
    Stop,
    Unwatched,
    begins,
    current,
    final_end,
    read_attempts,
)
from slurmddp.rundir.script_saves import newest_kept, read_saves
from slurmddp.rundir.trial import TrialRecord

RunState = Literal[JobState, "UNSUBMITTED"]
"""What `status` shows for a run: Slurm's state, or that it was never submitted."""
# How the reason of a run's final attempt record reads as a state (sacct's spelling).
FINAL_STATES: dict[EndReason, JobState] = {
    "completed": "COMPLETED",
    # A search's trial the pruner stopped: its job ended as it should (status shows the trial's state).
    "pruned": "COMPLETED",
    "cancelled": "CANCELLED",
    "failure": "FAILED",
    "timeout": "TIMEOUT",
    "preemption": "PREEMPTED",
    "killed": "FAILED",
}
ACTIVE_STATES: frozenset[RunState] = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SUSPENDED",
    }
)


@dataclass(frozen=True)
class Run:
    """A run, or one element of a sweep: where it lives and every job id it has had."""

    index: int | None
    """The sweep index; None for a plain run."""
    dir: Path
    overrides: dict[str, Any]
    job_ids: tuple[str, ...]
    """Oldest first; the last is the current one (`ARRAYID_TASK` for an array task)."""
    logs: Path
    """submitit's folder holding the current job's per-rank logs."""

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


@dataclass(frozen=True)
class Target:
    """A run or a sweep, as found on disk."""

    kind: RunKind
    dir: Path
    manifest: RunManifest | SweepManifest
    elements: tuple[Run, ...] = field(default=())
    named: int | None = None
    """The sweep's element the reference named (its directory, or its array task's job id, `8_7`):
    what a command that takes --index acts on without one; None: the sweep as a whole."""

    @property
    def whole_sweep(self) -> bool:
        """A sweep, named as a whole: `cancel` without --index then cancels every element."""
        return self.kind == "sweep" and self.named is None

    @property
    def backend(self) -> Backend:
        return for_manifest(self.manifest)

    @property
    def sweep(self) -> SweepManifest | None:
        """The sweep's manifest; None for a single run."""
        return self.manifest if isinstance(self.manifest, SweepManifest) else None

    @property
    def metric(self) -> str | None:
        """The metric the sweep names to rank by; None for a run, or a sweep that names none."""
        return self.sweep.metric if self.sweep is not None else None

    @property
    def executor(self) -> RunExecutor:
        return self.backend.executor

    def element(self, index: int | None) -> Run:
        if index is None and self.named is not None:
            index = self.named
        if index is None:
            if len(self.elements) == 1:
                return self.elements[0]
            raise SlurmddpError(
                f"{self.dir} is a sweep of {len(self.elements)} elements: name one with --index"
            )
        for element in self.elements:
            if element.index == index:
                return element
        if self.kind == "run":
            raise SlurmddpError(f"--index {index}: {self.dir} is a single run, not a sweep; drop --index")
        last = len(self.elements) - 1
        raise SlurmddpError(f"{self.dir}: no element {index}; the sweep's indices are 0-{last}")


def resolve(ref: str | None) -> Target:
    """A run or sweep from its directory, an element's directory, a folder of runs (its newest), a
    job id, or (None) the newest."""
    if ref is None:
        latest = index.recent(1)
        if not latest:
            raise SlurmddpError("nothing submitted yet (no runs in the index); name a run directory")
        return load(Path(latest[0]["dir"]))
    path = Path(ref)
    if path.is_dir():
        if any(record.is_file() for record in (path / MANIFEST, path / SWEEP, path.parent / SWEEP)):
            return load(path)
        # A folder of runs (output_dir, or OUTPUT_DIR/NAME): its newest submission, as with no ref.
        found = [
            record
            for depth in ("*", "*/*")
            for name in (MANIFEST, SWEEP)
            for record in path.glob(f"{depth}/{name}")
            if not (record.parent.parent / SWEEP).is_file()  # a sweep's element: the sweep counts
        ]
        if not found:
            raise SlurmddpError(
                f"{path} holds no slurmddp run: no {MANIFEST} or {SWEEP} in it or in the two levels of "
                "folders below it; name a run directory"
            )
        return load(max(found, key=lambda record: record.stat().st_mtime).parent)
    if ref.split("_")[0].isdigit():
        indexed: Path | None = next(
            (
                Path(record["dir"])
                for record in reversed(index.records())
                if record["job_id"] == ref.split("_")[0] and Path(record["dir"]).is_dir()
            ),
            None,
        )
        target = load(indexed or _dir_from_queue(ref))
        if "_" not in ref or target.kind != "sweep":
            return target
        # An array task: the element that ran (or runs) as that job.
        named = next((e.index for e in target.elements if ref in e.job_ids), None)
        if named is None:
            raise SlurmddpError(f"job {ref}: {target.dir} has no element that ran as that array task")
        return replace(target, named=named)
    raise SlurmddpError(f"{ref!r} is neither a run or sweep directory nor a job id")


def load(path: Path) -> Target:
    path = path.resolve()
    if (path / SWEEP).is_file():
        return _load_sweep(path)
    if (path.parent / SWEEP).is_file():  # an element's directory (a local one has a manifest too)
        sweep = _load_sweep(path.parent)
        return replace(sweep, named=next((e.index for e in sweep.elements if e.dir == path), None))
    if (path / MANIFEST).is_file():
        manifest = RunManifest.read(path)
        # A resubmitted run has had a job per submission, the current one last.
        element = Run(None, path, {}, manifest.jobs, _logs(path / MANIFEST, manifest.logs))
        return Target("run", path, manifest, (element,))
    raise SlurmddpError(f"{path} is not a slurmddp run or sweep directory (no {MANIFEST} or {SWEEP})")


def _load_sweep(path: Path) -> Target:
    manifest = SweepManifest.read(path)
    jobs: dict[int, list[str]] = {}
    logs: dict[int, Path] = {}
    for submission in manifest.submissions:
        if submission.job_id is None:
            continue
        indices = submission.elements
        for position, number in enumerate(indices):
            job = submission.job_id if len(indices) == 1 else f"{submission.job_id}_{position}"
            jobs.setdefault(number, []).append(job)
            logs[number] = _logs(path / SWEEP, submission.logs or manifest.logs)
    elements = tuple(
        Run(
            e.index,
            path / e.dir,
            _trial_values(path / e.dir) if manifest.search is not None else e.overrides,
            tuple(jobs.get(e.index, ())),
            logs.get(e.index) or _logs(path / SWEEP, manifest.logs),
        )
        for e in manifest.elements
    )
    return Target("sweep", path, manifest, elements)


def _trial_values(run_dir: Path) -> dict[str, Any]:
    """A search's element varies what its trial chose when it started (nothing before)."""
    record = TrialRecord.read(run_dir)
    return {} if record is None else record.params


def _logs(manifest: Path, logs: str | None) -> Path:
    """submitit's folder a manifest names."""
    if logs is None:
        raise SlurmddpError(f"cannot read {manifest}: it names no logs folder (key 'logs')")
    return Path(logs)


def _dir_from_queue(job_id: str) -> Path:
    command = slurm.queued_field(job_id, "%o")
    if not command:
        raise SlurmddpError(f"job {job_id} is neither in the index of submissions nor in the queue")
    # The batch script is DIR/logs/JOBID_submission.sh (submitit's folder layout).
    return Path(command).parent.parent


# ---- the state of jobs and elements ----


def element_state(target: Target, element: Run, states: dict[str, JobState]) -> RunState:
    """What a run is doing: its own final record first, then what Slurm says."""
    records = read_attempts(element.dir)
    final = final_end(records)
    if final is not None:
        return FINAL_STATES.get(final.reason, "FAILED")
    state = target.backend.state(element.dir, element.job_id, states)
    return "UNSUBMITTED" if state is None else state


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as its record says."""

    attempt: int
    """Counted from 1 over the run, as `attempts` counts them."""
    reason: EndReason
    step: int | None
    """The step it reached: its stop record's where it stopped on a signal (a cancel's end record
    names none), else its end record's."""
    requeue: bool
    message: str
    in_job: bool = False
    """Restarted as a new step of the same allocation, not through the queue."""


def attempt_ends(records: list[AttemptEvent], run_dir: Path) -> list[AttemptEnd]:
    """How each attempt ended, oldest first (a cancel ends the attempt it stopped)."""
    out = []
    begun: list[Begin] = []
    for record in records:
        if isinstance(record, Begin):
            begun.append(record)
        elif isinstance(record, End):
            ended = record.attempt_id or (begun[-1].attempt_id if begun else None)
            step = _stop_step(run_dir, ended)
            out.append(
                AttemptEnd(
                    len(begun),
                    record.reason,
                    record.step if step is None else step,
                    record.requeue,
                    record.message,
                    record.in_job,
                )
            )
    return out


def _reached(
    run_dir: Path,
    records: list[AttemptEvent],
    latest: AttemptId | None,
    progress: Progress | None,
    metric_step: int | None,
) -> int | None:
    """How far the run got: the progress record lags by a few seconds, so a stop's record or an
    end's, where later, says where the latest attempt got to."""
    known = (progress and progress.step, metric_step, _stop_step(run_dir, latest), _end_step(records))
    steps = [step for step in known if isinstance(step, int)]
    return max(steps) if steps else None


def _end_step(records: list[AttemptEvent]) -> int | None:
    """The step the latest attempt's end record names, once it ended (a later begin: a new
    attempt, back at its checkpoint's step)."""
    for record in reversed(current(records)):
        if isinstance(record, Begin):
            return None
        if isinstance(record, End):
            return record.step
    return None


def _stop_step(run_dir: Path, attempt: AttemptId | None) -> int | None:
    """The step `attempt`'s ranks stopped at after a stop signal, where it recorded one."""
    stop = None if attempt is None else Stop.read_for(run_dir, attempt)
    return None if stop is None else stop.step


@dataclass(frozen=True)
class Resume:
    """Where a resubmit of the run starts: the newest complete checkpoint, or step 0."""

    step: int
    """0 where no complete checkpoint exists."""
    checkpoint: str | None
    """The checkpoint's directory; None: none, the run starts over."""
    saves: int = 0
    """How many checkpoints a script saved itself (rundir/script_saves.py): where it did and
    slurmddp's own checkpoints hold none, `checkpoint` is the newest of them still there."""


def resume_point(run_dir: Path, workdir: str | None) -> Resume:
    """The checkpoint a resubmit resumes from, judged by the rule the ranks load by
    (job/checkpoint/completeness.py); file sizes only, not checksums, as a rank's first look. A
    script that saves with torch.distributed.checkpoint into a directory of its own resumes from
    the newest it saved."""
    steps = {path: step for step, path in step_dirs(checkpoint_dir(run_dir, workdir))}
    found, _ = newest_complete(
        steps, lambda path: checkpoint_problems(path, steps[path], None, check_crc=False)
    )
    if found is not None:
        return Resume(steps[found], str(found))
    saves = read_saves(run_dir)
    kept = newest_kept(saves)
    return Resume(0, None, len(saves)) if kept is None else Resume(kept.step, kept.path, len(saves))


@dataclass(frozen=True)
class Row:
    """One line of `status`."""

    index: int | None
    overrides: dict[str, Any]
    state: RunState
    attempts: int
    """How many attempts ran: attempt 1 is the first (0: none started yet)."""
    step: int | None
    metrics: dict[str, float]
    """The latest value of every metric rank 0 logged."""
    elapsed_s: float
    job_id: str | None
    dir: str
    cpu_hours: float | None = None
    """Over every allocation of every job the run had (see manage/accounting.py); None for a
    local run, or when sacct cannot answer."""
    gpu_hours: float | None = None
    lost_hours: float | None = None
    """Time lost to requeues: work redone after the last checkpoint, and the wait in the queue."""
    last_end: str | None = None
    """How the latest attempt ended, as its record says ("failure at step 3 (hung at step 3: rank 1
    on node2 ...); leaving out node2; requeue 1 (budget 3)")."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Hosts the run leaves out, with why (RUN_DIR/excluded.json): for good, and those set aside
    for its latest allocation only, whose reason ends in ALLOCATION_ONLY."""
    set_aside: list[str] = field(default_factory=list)
    """Of `excluded`, the hosts left out of the latest allocation only: a requeue or a resubmit
    may give them ranks again."""
    unwatched: dict[int, str] = field(default_factory=dict)
    """The latest attempt's ranks whose peer watch could not start or stopped, with what happened
    ("stopped (OSError(...))")."""
    throughput: str | None = None
    """The latest telemetry record's pace: "7,251 samples/s" (or steps/s without ctx.loader)."""
    pace: numbers.Pace | None = None
    """The same pace as a number and its unit."""
    ended: list[AttemptEnd] = field(default_factory=list)
    """How each attempt ended (preempted, timed out, failed, completed), oldest first."""
    resume: Resume = field(default_factory=lambda: Resume(0, None))
    """Where a resubmit would start."""
    skipped: SkippedSaves | None = None
    """The checkpoints the loop could not save for want of space; None: none skipped."""
    slow: SlowNode | None = None
    """The node the latest attempt found slowing every step (job/train/stragglers.py); None: none."""
    goodput: Goodput | None = None
    """The share of the allocated time that trained, and where the rest went (manage/goodput.py);
    None before the first attempt began."""
    trial: TrialRecord | None = None
    """A search's element: the Optuna trial it runs (its number, state, value); None before its
    first start, and in other runs."""

    @property
    def shown_state(self) -> str:
        """The state as tables show it: PRUNED for a trial the pruner stopped (its job COMPLETED)."""
        return "PRUNED" if self.trial is not None and self.trial.state == "pruned" else self.state


def rows(target: Target, with_usage: bool = True) -> list[Row]:
    """One row per element; `with_usage=False` skips the sacct call of the hours (for polling)."""
    ids = [e.job_id for e in target.elements if e.job_id is not None]
    states = target.backend.job_states(ids)
    every_job = [job for element in target.elements for job in element.job_ids]
    allocations = target.backend.allocations(every_job) if with_usage else None
    since = _submitted_at(target.manifest)
    now = time.time()
    out = []
    for element in target.elements:
        records = read_attempts(element.dir)
        latest = _latest_attempt(records)
        left_out = _left_out(element.dir, latest)
        used = _usage(element, records, allocations, states, since, now)
        metrics, metric_step = latest_values(read_metrics(element.dir))
        perf = {name: metrics.pop(name) for name in list(metrics) if name.startswith(PERF)}
        progress = Progress.read(element.dir)
        state = element_state(target, element, states)
        out.append(
            Row(
                index=element.index,
                overrides=element.overrides,
                state=state,
                attempts=attempts_ran(element, records, progress),
                step=_reached(element.dir, records, latest, progress, metric_step),
                metrics=metrics,
                elapsed_s=_elapsed(
                    element, records, _element_submitted_at(target.manifest, element.index), state, now
                ),
                job_id=element.job_id,
                dir=str(element.dir),
                cpu_hours=None if used is None else used.cpu_hours,
                gpu_hours=None if used is None else used.gpu_hours,
                lost_hours=None if used is None else used.lost_hours,
                last_end=_last_end(records),
                excluded={host: _left_out_for(why) for host, why in left_out.items()},
                set_aside=[host for host, why in left_out.items() if why.allocation is not None],
                unwatched=_unwatched(element.dir, latest),
                throughput=numbers.pace(perf),
                pace=numbers.pace_of(perf),
                ended=attempt_ends(records, element.dir),
                resume=resume_point(element.dir, target.manifest.workdir),
                skipped=SkippedSaves.read(element.dir),
                slow=_slow_node(element.dir, latest),
                goodput=goodput.of_run(
                    records,
                    _element_submitted_at(target.manifest, element.index, first=True),
                    progress,
                    state in ACTIVE_STATES,
                    now,
                    spare_share(element.dir),
                ),
                trial=TrialRecord.read(element.dir),
            )
        )
    return out


ALLOCATION_ONLY = "(this allocation only: suspected, not confirmed)"


def _latest_attempt(records: list[AttemptEvent]) -> AttemptId | None:
    """The attempt that began last since the last resubmit (a resubmit is a new job)."""
    began = begins(current(records))
    return began[-1].attempt_id if began else None


def _left_out(run_dir: Path, latest: AttemptId | None) -> dict[str, Exclusion]:
    """The hosts the run leaves out: for good, and those set aside in the `latest` attempt's
    allocation (an earlier allocation's are no longer left out)."""
    excluded = Exclusions.read(run_dir)
    return excluded.hosts if latest is None else excluded.applying_to(latest)


def _slow_node(run_dir: Path, latest: AttemptId | None) -> SlowNode | None:
    """The node the `latest` attempt found slow (an earlier attempt's may be gone from the job)."""
    found = SlowNode.read(run_dir)
    return found if found is not None and found.host is not None and found.attempt == latest else None


def _left_out_for(why: Exclusion) -> str:
    return why.reason if why.allocation is None else f"{why.reason} {ALLOCATION_ONLY}"


def _unwatched(run_dir: Path, latest: AttemptId | None) -> dict[int, str]:
    found = [] if latest is None else Unwatched.read_for(run_dir, latest)
    return {unwatched.rank: unwatched.what for unwatched in found}


def _last_end(records: list[AttemptEvent]) -> str | None:
    """How the last attempt since the last resubmit ended: what ended the run before is history."""
    return next((r.message for r in reversed(current(records)) if isinstance(r, End)), None)


def attempts_ran(element: Run, records: list[AttemptEvent], progress: Progress | None) -> int:
    """How many attempts ran, attempt 1 being the first: each attempt's begin is recorded (by the
    batch script on Slurm, by rank 0 of a local run). A local run written before they were
    recorded counts as far as its latest progress record's attempt, or as one attempt once its
    rank 0 started writing its log."""
    begun = sum(1 for r in records if isinstance(r, Begin))
    seen = progress.attempt.restart_count + 1 if progress is not None else 0
    started = int(element.job_id is not None and (element.logs / f"{element.job_id}_0_log.err").exists())
    return max(begun, seen, started)


def total_usage(rows: list[Row]) -> accounting.Usage | None:
    """The figures of a sweep: the sum over its elements (None for a local sweep)."""
    return accounting.total(
        None
        if row.cpu_hours is None or row.gpu_hours is None or row.lost_hours is None
        else accounting.Usage(row.cpu_hours, row.gpu_hours, row.lost_hours)
        for row in rows
    )


def _usage(
    element: Run,
    records: list[AttemptEvent],
    allocations: list[slurm.Allocation] | None,
    states: dict[str, JobState],
    since: float | None,
    now: float,
) -> accounting.Usage | None:
    if allocations is None or not element.job_ids:
        return None
    mine = accounting.submitted_since((a for a in allocations if a.job_id in element.job_ids), since)
    pending = {job for job in element.job_ids if states.get(job) in accounting.PENDING_AGAIN}
    return accounting.usage(mine, records, now, pending)


def _submitted_at(manifest: RunManifest | SweepManifest) -> float | None:
    """When the run (or the sweep's first submission) was submitted, as Unix time, if recorded."""
    submissions = manifest.submissions if isinstance(manifest, SweepManifest) else []
    return _earliest([*(s.submitted_at for s in submissions), manifest.submitted_at])


def _earliest(times: Sequence[str | float | None]) -> float | None:
    """The earliest of `times` (Unix times, or ISO times), where any is known."""
    known = []
    for value in times:
        if isinstance(value, (int, float)):
            known.append(float(value))
        elif isinstance(value, str):
            try:
                known.append(dt.datetime.fromisoformat(value).timestamp())
            except ValueError:
                continue
    return min(known) if known else None


def _element_submitted_at(
    manifest: RunManifest | SweepManifest, index: int | None, first: bool = False
) -> float | None:
    """When this element (or the run) was last (`first`: first) submitted, as Unix time, if
    recorded."""
    submissions = manifest.submissions if isinstance(manifest, SweepManifest) else []
    mine = [s for s in submissions if index in s.elements]
    return _earliest([mine[0 if first else -1].submitted_at]) if mine else _submitted_at(manifest)


def _elapsed(
    element: Run, records: list[AttemptEvent], submitted_at: float | None, state: RunState, now: float
) -> float:
    """Seconds spent in attempts (time in the queue between them does not count)."""
    if not any(isinstance(r, Begin) for r in records):
        return _elapsed_without_records(element, submitted_at, state, now)
    total = 0.0
    started: float | None = None
    for record in records:
        if isinstance(record, Begin):
            started = record.time
        elif isinstance(record, End) and started is not None:
            total += record.time - started
            started = None
    if started is not None:
        # An attempt whose end nobody recorded (its rank 0 killed) ended, if the run did, with
        # its ranks' last write to their logs.
        last = now if state in ACTIVE_STATES else _last_write(element)
        total += max((last or started) - started, 0.0)
    return total


def _elapsed_without_records(element: Run, submitted_at: float | None, state: RunState, now: float) -> float:
    """A local run written before local attempts were recorded: it ran from its submission (it
    does not queue) until its ranks' last write to their logs, or until now."""
    if submitted_at is None or element.job_id is None:
        return 0.0
    if state in ACTIVE_STATES:
        return max(now - submitted_at, 0.0)
    written = _last_write(element)
    return max(written - submitted_at, 0.0) if written is not None else 0.0


def _last_write(element: Run) -> float | None:
    """When the current job's ranks last wrote to their logs, if they did."""
    written = []
    for path in element.logs.glob(f"{element.job_id}_*"):
        try:
            written.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(written) if written else None
