"""Acting on submitted runs and sweeps from the login node: interrupt, cancel, resubmit."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmddp.cluster import hostlist, slurm
from slurmddp.defaults import OUTPUT_DIR_MODES, SIGNAL_LEAD_S, STOP_SIGNAL, RequeueReason
from slurmddp.errors import SlurmddpError
from slurmddp.experiment.load import Loaded, SweepElement, load_experiment
from slurmddp.experiment.resubmit import accumulate_for, check_changes
from slurmddp.experiment.search import element_dir as search_element_dir
from slurmddp.files import make_dirs
from slurmddp.manage import report, runs
from slurmddp.manage.amend import with_exclude
from slurmddp.manage.backend import SaveFirst
from slurmddp.manage.runs import RunState
from slurmddp.rundir import records
from slurmddp.rundir.config import read_config, write_config
from slurmddp.rundir.layout import CONFIG, PROGRESS
from slurmddp.rundir.manifest import ElementEntry, RunManifest, Submitted
from slurmddp.rundir.records import (
    CANCELLED,
    End,
    Exclusion,
    Exclusions,
    Progress,
    Resubmit,
)
from slurmddp.submit import submitter
from slurmddp.submit.prepare import plan_for

# States `resubmit --failed` reruns: the run ended without completing and was not cancelled.
FAILED_STATES: frozenset[RunState] = frozenset(
    {"FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def interrupt(ref: str | None, reason: RequeueReason, index: int | None = None) -> str:
    """Send the running job what Slurm sends on a preemption or near its time limit, and record
    which of the two it stands for; returns what was done."""
    target = runs.resolve(ref)
    element = target.element(index)
    config = read_config(element.dir)
    name = str(config.get("requeue", {}).get("signal", STOP_SIGNAL))
    entrypoint = config.get("entrypoint")
    script = isinstance(entrypoint, dict) and entrypoint.get("function") is None
    said = target.backend.interrupt(element.dir, element.job_id, element.logs, reason, name, script)
    return f"{said}; run dir {element.dir}"


def cancel(
    ref: str | None,
    index: int | None = None,
    now: bool = False,
    waiting: Callable[[Sequence[str], float], None] = lambda jobs, wait_s: None,
) -> list[str]:
    """Cancel a run, a whole sweep, or one element; returns a line per element cancelled.

    Each run is marked final in its attempts.jsonl before its ranks are stopped, so that neither
    a rank's requeue in flight nor the next batch-script start brings it back. Running ranks stop
    at an agreed step and save first, as on a preemption, unless `now`; `waiting(jobs, wait_s)`
    is told which jobs that is and for how long at most.
    """
    target = runs.resolve(ref)
    whole_sweep = index is None and target.whole_sweep
    chosen = target.elements if whole_sweep else (target.element(index),)
    known = target.backend.job_states([e.job_id for e in chosen if e.job_id])
    done = []
    for element in chosen:
        state = runs.element_state(target, element, known)
        if state not in runs.ACTIVE_STATES and state != "UNKNOWN":
            continue
        cancelled = End(
            CANCELLED, None, time.time(), requeue=False, final=True, message="cancelled by the user"
        )
        records.append_attempt(element.dir, cancelled)
        done.append(element)
    submissions = target.sweep.submissions if whole_sweep and target.sweep is not None else []
    save = None if now or not done else _save_first(done[0], waiting)
    saved = target.backend.cancel(
        [e.job_id for e in done if e.job_id],
        array_ids=sorted({s.job_id for s in submissions if s.job_id}),
        save=save,
    )
    workdir = target.manifest.workdir
    return [
        f"{_label(e)}: {report.resumes(runs.resume_point(e.dir, workdir))}"
        if e.job_id in saved
        else _label(e)
        for e in done
    ]


def _save_first(element: runs.Run, waiting: Callable[[Sequence[str], float], None]) -> SaveFirst:
    """The stop signal a sweep's elements share, and the lead its save is given before a limit."""
    # A run directory written before config.yaml was kept has the defaults.
    requeue = read_config(element.dir).get("requeue", {}) if (element.dir / CONFIG).is_file() else {}
    wait_s = float(requeue.get("signal_lead_s", SIGNAL_LEAD_S))
    return SaveFirst(str(requeue.get("signal", STOP_SIGNAL)), wait_s, lambda jobs: waiting(jobs, wait_s))


def _label(element: runs.Run) -> str:
    where = f"element {element.index} " if element.index is not None else ""
    return f"{where}job {element.job_id} ({element.dir})"


@dataclass(frozen=True)
class ResubmittedElements:
    job_id: str
    indices: list[int]
    notes: list[str]


def resubmit_failed(ref: str, argv: list[str], forget_exclusions: bool = False) -> ResubmittedElements:
    """Submit the failed elements of a sweep again, as one new array; each resumes from its own
    latest checkpoint with fresh budgets. The hosts any of them left out stay out of the whole
    array (a node that broke one element's run is no better for the next), unless
    `forget_exclusions`: then the failed elements' excluded.json are cleared."""
    target = runs.resolve(ref)
    if target.kind != "sweep":
        raise SlurmddpError(f"{target.dir} is a single run; resubmit works on sweeps (submit the run again)")
    if not target.backend.resubmits_arrays:
        raise SlurmddpError("resubmit needs Slurm; this sweep ran with the local executor")
    known = target.backend.job_states([e.job_id for e in target.elements if e.job_id])
    failed = [e for e in target.elements if runs.element_state(target, e, known) in FAILED_STATES]
    if not failed:
        raise SlurmddpError(f"{target.dir}: no failed elements to resubmit")
    manifest = target.sweep
    assert manifest is not None  # a target of kind "sweep" is read from its sweep.json
    dirs = [e.dir for e in failed]
    hosts: list[str]
    if forget_exclusions:
        # No resubmit rewrites a sweep's config.yaml files: the hosts left out are in excluded.json only.
        hosts, notes = [], _forget_notes(dirs)
    else:
        hosts, notes = _left_out(dirs, _saved(target.dir, manifest))
    elements = [
        SweepElement(e.index or 0, e.overrides, e.dir.name, _kept_out(_saved(e.dir, manifest), hosts))
        for e in failed
    ]
    plan = plan_for(
        _kept_out(_saved(target.dir, manifest), hosts),
        elements=elements,
        executor=target.executor,
        run_dir=target.dir,
        workdir=_workdir(target.dir, manifest),
        submission=len(manifest.submissions),
        max_parallel=manifest.max_parallel,
    )
    submitter.check_array_size(len(failed), slurm.max_array_size())
    target.backend.check_schedulable(plan)
    indices = [e.index for e in failed if e.index is not None]
    for element in failed:
        records.append_attempt(element.dir, Resubmit(time.time(), argv))
    forgotten = _forget(dirs) if forget_exclusions else {}
    try:
        job_id = submitter.submit_array(plan, manifest, indices)
    except BaseException:
        _put_back(forgotten)
        raise
    return ResubmittedElements(job_id, indices, notes)


def add_trials(ref: str, count: int) -> ResubmittedElements:
    """Add `count` trials to a search's study: as many new elements, one new array, each asking
    for its trial as it starts (after those of the study so far, so it learns from them)."""
    target = runs.resolve(ref)
    manifest = target.sweep
    if manifest is None or manifest.search is None:
        raise SlurmddpError(
            f"--trials: {target.dir} is no search (a sweep with sweep.search); submit it again"
        )
    if not target.backend.resubmits_arrays:
        raise SlurmddpError("resubmit --trials needs Slurm; this search ran with the local executor")
    if count < 1:
        raise SlurmddpError(f"--trials {count}: give how many trials to add, 1 or more")
    first = len(manifest.elements)
    total = first + count
    base = _saved(target.dir, manifest)
    names = [search_element_dir(index, total) for index in range(first, total)]
    elements = [
        SweepElement(index, {}, name, base) for index, name in zip(range(first, total), names, strict=True)
    ]
    search = {**manifest.search, "spec": {**manifest.search["spec"], "trials": total}}
    grown = dataclasses.replace(
        manifest,
        elements=[*manifest.elements, *(ElementEntry(e.index, e.dir_name, {}) for e in elements)],
        search=search,
    )
    plan = plan_for(
        base,
        elements=elements,
        executor=target.executor,
        run_dir=target.dir,
        workdir=_workdir(target.dir, manifest),
        submission=len(manifest.submissions),
        max_parallel=manifest.max_parallel,
    )
    submitter.check_array_size(count, slurm.max_array_size())
    target.backend.check_schedulable(plan)
    mode = OUTPUT_DIR_MODES[base.experiment.output_mode]
    try:
        for element in elements:
            make_dirs(target.dir / element.dir_name, mode)
            write_config(target.dir / element.dir_name, base.resolved)
        job_id = submitter.submit_array(plan, grown, [e.index for e in elements])
    except BaseException:
        manifest.write(target.dir)
        for element in elements:
            shutil.rmtree(target.dir / element.dir_name, ignore_errors=True)
        raise
    return ResubmittedElements(job_id, [e.index for e in elements], [])


@dataclass(frozen=True)
class Resubmitted:
    submission: submitter.Submission
    changed: list[str]
    """The config keys the resubmission changed (ddp.accumulate and resources.exclude included
    when it set them itself)."""
    notes: list[str]


def resubmit_run(
    ref: str, overrides: list[str], argv: list[str], forget_exclusions: bool = False
) -> Resubmitted:
    """Submit a single run that ended without completing again, in its own directory, with
    `overrides` (more time, another partition, another size); it resumes from its latest
    checkpoint with fresh budgets. With another number of ranks, ddp.accumulate is set so that each
    rank's micro-batch is no larger than before, and the hosts the run left out stay left out,
    unless `forget_exclusions`: then its excluded.json is cleared and they may run it again."""
    target = runs.resolve(ref)
    if target.kind != "run":
        raise SlurmddpError(
            f"{target.dir} is a sweep: `resubmit --failed` submits its failed elements again "
            "(without overrides); a single run takes overrides"
        )
    manifest = target.manifest
    assert isinstance(manifest, RunManifest)  # a target of kind "run" is read from its manifest.json
    element = target.elements[0]
    known = target.backend.job_states([element.job_id]) if element.job_id else {}
    state = runs.element_state(target, element, known)
    if state in runs.ACTIVE_STATES:
        raise SlurmddpError(
            f"job {element.job_id} of {target.dir} is {state}: cancel it first "
            f"(python -m slurmddp cancel {target.dir}) or let it end, then resubmit"
        )
    if state == "COMPLETED":
        raise SlurmddpError(f"{target.dir} completed: there is nothing to resume")
    before = _saved(target.dir, target.manifest)
    after, notes = _kept_as_before(target, before, overrides, forget_exclusions)
    changed = check_changes(before.resolved, after.resolved)
    ranks = (before.experiment.resources.world_size, after.experiment.resources.world_size)
    plan = plan_for(
        after, executor=target.executor, run_dir=target.dir, workdir=_workdir(target.dir, manifest)
    )
    target.backend.check_schedulable(plan)
    previous = records.final_end(records.read_attempts(target.dir))
    records.append_attempt(target.dir, Resubmit(time.time(), argv, changed, list(ranks)))
    # Before the job is submitted: its first attempt may read excluded.json before sbatch returns.
    forgotten = _forget([target.dir]) if forget_exclusions else {}
    try:
        sub = submitter.resubmit(plan, after, manifest, argv)
    except BaseException:
        _put_back(forgotten)
        if previous is not None:
            # The run reads as it did: ended, with the same reason.
            records.append_attempt(target.dir, dataclasses.replace(previous, time=time.time()))
        raise
    return Resubmitted(sub, changed, notes)


def _kept_as_before(
    target: runs.Target, before: Loaded, overrides: list[str], forget_exclusions: bool
) -> tuple[Loaded, list[str]]:
    """The saved experiment with `overrides`, and with what keeps the run as it was (each rank's
    micro-batch when the number of ranks changes, the hosts it left out unless
    `forget_exclusions`), and a note on each."""
    after = _saved(target.dir, target.manifest, overrides)
    notes = []
    ranks = (before.experiment.resources.world_size, after.experiment.resources.world_size)
    if ranks[0] != ranks[1] and "ddp.accumulate" not in check_changes(before.resolved, after.resolved):
        accumulate = before.experiment.ddp.accumulate
        wanted = accumulate_for(accumulate, *ranks, _global_batch(target.dir))
        if wanted != accumulate:
            after = _saved(target.dir, target.manifest, [*overrides, f"ddp.accumulate={wanted}"])
            notes.append(
                f"{ranks[0]} ranks -> {ranks[1]}: ddp.accumulate {accumulate} -> {wanted}, so that each "
                "rank's micro-batch is no larger than before (the global batch stays; set "
                "ddp.accumulate=N to choose)"
            )
    if forget_exclusions:
        return _forgetting(after, Exclusions.read(target.dir), overrides), notes + _forget_notes([target.dir])
    hosts, left_out = _left_out([target.dir], after)
    return _kept_out(after, hosts), notes + left_out


def _left_out(run_dirs: Sequence[Path], loaded: Loaded) -> tuple[list[str], list[str]]:
    """The hosts to go on leaving out, those these runs left out (excluded.json) with the
    experiment's own resources.exclude, and a note on each host they left out; nothing when none."""
    left_out: dict[str, Exclusion] = {}
    for run_dir in run_dirs:
        left_out.update(Exclusions.read(run_dir).hosts)
    if not left_out:
        return [], []
    user = loaded.experiment.resources.exclude
    hosts = sorted({*left_out, *(hostlist.expand(user) if user else [])})
    notes = [f"leaves out {host}: {why.reason}" for host, why in left_out.items()]
    return hosts, notes


def _forgetting(loaded: Loaded, forgotten: Exclusions, overrides: Sequence[str]) -> Loaded:
    """`loaded` without the hosts the run left out itself in its resources.exclude, where an
    earlier resubmit wrote them; the user's own hosts stay, and a resources.exclude given with this
    resubmit stands as given."""
    exclude = loaded.experiment.resources.exclude
    listed = hostlist.expand(exclude) if exclude else []
    own = [host for host in listed if host not in forgotten.hosts]
    given = "resources.exclude" in (text.partition("=")[0] for text in overrides)
    return loaded if given or own == listed else with_exclude(loaded, own)


def _forget_notes(run_dirs: Sequence[Path]) -> list[str]:
    left_out = {host: why for run_dir in run_dirs for host, why in Exclusions.read(run_dir).hosts.items()}
    if not left_out:
        return ["--forget-exclusions: no host was left out"]
    return [f"no longer leaves out {host} ({why.reason})" for host, why in left_out.items()]


def _forget(run_dirs: Sequence[Path]) -> dict[Path, Exclusions]:
    """Clear the hosts `run_dirs` left out; returns what they were, to put back should the
    submission fail."""
    before = {run_dir: Exclusions.read(run_dir) for run_dir in run_dirs}
    for run_dir, excluded in before.items():
        if excluded.hosts:
            Exclusions().write(run_dir)
    return before


def _put_back(before: dict[Path, Exclusions]) -> None:
    for run_dir, excluded in before.items():
        if excluded.hosts:
            excluded.write(run_dir)


def _kept_out(loaded: Loaded, hosts: Sequence[str]) -> Loaded:
    return with_exclude(loaded, hosts) if hosts else loaded


def _global_batch(run_dir: Path) -> int | None:
    """The global batch the run's loop recorded (ctx.loader's), if it recorded one."""
    progress = Progress.read(run_dir)
    value = progress.loop.global_batch if progress is not None and progress.loop is not None else None
    return value if isinstance(value, int) and value > 0 else None


def _saved(run_dir: Path, manifest: Submitted, overrides: Sequence[str] = ()) -> Loaded:
    """The experiment as it was submitted, from the config.yaml saved in `run_dir` (the experiment
    file may have changed since), with `overrides`. Its profile is already merged in."""
    loaded = load_experiment(run_dir / CONFIG, ["profile=null", *overrides])
    # Relative entrypoints are looked up from the experiment's own directory, as at submit time.
    return dataclasses.replace(loaded, source=Path(_named(run_dir, manifest.experiment, "experiment")))


def _workdir(run_dir: Path, manifest: Submitted) -> Path:
    return Path(_named(run_dir, manifest.workdir, "workdir"))


def _named(run_dir: Path, value: str | None, key: str) -> str:
    """A manifest's `key`, which a resubmit needs."""
    if value is None:
        raise SlurmddpError(f"{run_dir}: its manifest has no {key!r}; it cannot be resubmitted")
    return value


def last_save_seconds(output_dir: Path, name: str) -> float | None:
    """How long the newest earlier run of this experiment took to save a checkpoint, if known."""
    try:
        found = sorted((output_dir / name).glob(f"*/{PROGRESS}"), reverse=True)
    except OSError:
        return None  # an output_dir that cannot be read: the submission itself says why
    for path in found:
        progress = Progress.read(path.parent)
        seconds = progress.loop.last_save_s if progress is not None and progress.loop is not None else None
        if seconds:
            return seconds
    return None
