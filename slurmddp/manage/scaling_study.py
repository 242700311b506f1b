"""`scale`: submit the elements of a scaling study, follow them, report what they measured.

The study directory is laid out as a sweep's (sweep.json, one directory an element), so status,
logs and cancel work on it; its elements are separate jobs, since each size asks Slurm for other
resources. On Slurm each element waits for the one before it (`--dependency=afterany`): measured
one at a time, no element shares the nodes or the fabric with another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from slurmddp.cluster import slurm
from slurmddp.errors import EXIT_JOB_FAILED, ConfigError, SlurmddpError
from slurmddp.experiment.load import Loaded, SweepElement, load_experiment, override_texts
from slurmddp.experiment.schema import Experiment
from slurmddp.experiment.study import Element, Study
from slurmddp.files import write_atomic
from slurmddp.manage import index, runs, scaling, scaling_report, sweep_runs
from slurmddp.manage.amend import with_dependency
from slurmddp.manage.backend import for_executor
from slurmddp.rundir.layout import STUDY_CSV, STUDY_PNG, SWEEP, new_run_dir
from slurmddp.rundir.manifest import ElementEntry, StudySettings, StudySize, SweepManifest
from slurmddp.rundir.outputs import PreflightReport, Result
from slurmddp.submit import submitter
from slurmddp.submit.prepare import plan_for, resolve_executor


def submit(base: Loaded, study: Study, argv: list[str], out: TextIO, wait: bool | None) -> int:
    """Submit every element of `study` of the experiment `base` (all or none), then, when waiting,
    follow them and print the report."""
    if base.sweep is not None:
        raise ConfigError(
            f"{base.source}: scale measures one experiment; drop its sweep: section (sweep=null)"
        )
    labelled = [(_loaded(base, element), element.label) for element in study.elements]
    executor = resolve_executor(base.experiment.executor)
    backend = for_executor(executor)
    study_dir = new_run_dir(base.experiment.output_dir, base.experiment.name)
    # Every size is asked about before any is submitted: a study is submitted whole or not at all.
    for element, _ in labelled:
        backend.check_schedulable(
            plan_for(element.loaded, executor=executor, run_dir=study_dir / element.dir_name)
        )
    plan = plan_for(base, executor=executor, run_dir=study_dir)
    created = submitter.make_run_dir(study_dir, base.experiment)
    described = StudySettings(study.mode, study.batch_key)
    manifest = submitter.study_manifest(plan, base, argv, [_entry(e) for e in study.elements], described)
    manifest.write(study_dir)
    out.write(f"slurmddp: {study.mode} scaling study of {len(study.elements)} jobs, one at a time\n")
    out.write(f"  study dir: {study_dir}\n")
    if backend.runs_here:
        index.remember(study_dir, "sweep", plan.job_name, "local")
        failed = sweep_runs.run_each(study_dir, manifest, labelled, argv, out)
        report(runs.load(study_dir), out)
        return EXIT_JOB_FAILED if failed else 0
    first = _submit_chain(labelled, study_dir, manifest, argv, created, out)
    index.remember(study_dir, "sweep", plan.job_name, first)
    if not (wait if wait is not None else True):
        out.write(f"  report:    python -m slurmddp results {study_dir}\n")
        return 0
    code = sweep_runs.wait(study_dir, out)
    report(runs.load(study_dir), out)
    return code


def _loaded(base: Loaded, element: Element) -> SweepElement:
    """The element as a sweep's: the experiment with its overrides, in its own directory."""
    overrides = [*base.overrides, *override_texts(element.overrides)]
    return SweepElement(
        element.index, element.overrides, dir_name(element), load_experiment(base.source, overrides)
    )


def _submit_chain(
    labelled: list[tuple[SweepElement, str]],
    study_dir: Path,
    manifest: SweepManifest,
    argv: list[str],
    created: list[Path],
    out: TextIO,
) -> str:
    """Submit the elements to Slurm, each depending on the one before; on a refusal cancel those
    already submitted and remove the study directory. The first job's id."""
    submitted: list[str] = []
    try:
        for element, label in labelled:
            one = (
                with_dependency(element.loaded, f"afterany:{submitted[-1]}") if submitted else element.loaded
            )
            sub = submitter.submit(
                plan_for(one, executor="slurm", run_dir=study_dir / element.dir_name), one, argv
            )
            submitted.append(sub.job_id)
            manifest = sweep_runs.record(study_dir, manifest, element, label, sub, out)
    except BaseException:
        if submitted:
            slurm.cancel(submitted)
        submitter.discard(study_dir, created)
        raise
    return submitted[0]


def dir_name(element: Element) -> str:
    """`002-2nodes`, `004-3nodes-bucket5`: the index first, so the directories sort."""
    text = element.label.replace(" node", "node").replace(", bucket ", "-bucket").replace(" MB", "")
    return f"{element.index:03d}-{text.replace(' ', '-')}"


def _entry(element: Element) -> ElementEntry:
    size = StudySize(element.role, element.label, element.nodes, element.ranks, element.bucket_cap_mb)
    return ElementEntry(element.index, dir_name(element), element.overrides, size)


def report(target: runs.Target, out: TextIO) -> scaling.Analysis:
    """Print the study's table, verdicts and bucket advice; write STUDY_DIR/study.csv and .png."""
    sweep = target.sweep
    study = sweep.study if sweep is not None else None
    if sweep is None or study is None:
        raise SlurmddpError(f"{target.dir} is not a scaling study (made by `python -m slurmddp scale`)")
    states = {row.index: row.state for row in runs.rows(target, with_usage=False)}
    described = {e.index: e for e in sweep.elements}
    points = [
        _point(element.dir, described[element.index or 0], states.get(element.index, "UNKNOWN"), study)
        for element in target.elements
    ]
    analysis = scaling.analyse(points, str(study.mode))
    out.write(scaling_report.study_table(analysis.rows, analysis.unit) + "\n")
    for line in analysis.verdicts:
        out.write(f"  {line}\n")
    if analysis.bucket_advice:
        out.write(f"  {analysis.bucket_advice}\n")
    write_atomic(target.dir / STUDY_CSV, scaling_report.study_csv(analysis.rows, analysis.unit))
    written = [str(target.dir / STUDY_CSV)]
    try:
        scaling_report.plot(analysis.rows, target.dir / STUDY_PNG, str(study.mode))
        written.append(str(target.dir / STUDY_PNG))
    except SlurmddpError as exc:
        out.write(f"slurmddp: no plot: {exc}\n")
    out.write(f"slurmddp: wrote {' and '.join(written)}\n")
    out.flush()
    return analysis


def _point(element_dir: Path, entry: ElementEntry, state: str, study: StudySettings) -> scaling.Point:
    """What one element measured, from its directory and its entry in the study's sweep.json."""
    size = entry.size
    if size is None:
        raise SlurmddpError(
            f"{element_dir}: its entry in {SWEEP} names no size: not a scaling study's element"
        )
    result = Result.read(element_dir)
    return scaling.Point(
        index=entry.index,
        label=size.label,
        nodes=size.nodes,
        ranks=size.ranks,
        bucket_cap_mb=size.bucket_cap_mb,
        state=state,
        telemetry=_with_samples(
            result.telemetry if result is not None else None, entry.overrides.get(str(study.batch_key))
        ),
        preflight=PreflightReport.read(element_dir),
        role=size.role,
    )


def _with_samples(telemetry: Any, global_batch: Any) -> dict[str, Any] | None:
    """A loop without `ctx.loader` counts steps, not samples; the study knows each element's global
    batch, and weak scaling compares samples (its global batch grows with the ranks)."""
    if not isinstance(telemetry, dict):
        return None
    steps_per_s = telemetry.get("steps_per_s")
    if telemetry.get("samples_per_s") is None and isinstance(global_batch, int) and steps_per_s:
        return {**telemetry, "samples_per_s": global_batch * steps_per_s}
    return telemetry


def cluster_nodes(exp: Experiment) -> int | None:
    """The nodes of the experiment's partition, checked before the study is submitted: a size the
    cluster cannot hold would wait in the queue for ever. None where scontrol cannot say or there
    is no cluster (local runs)."""
    return for_executor(resolve_executor(exp.executor)).partition_nodes(exp.resources.partition)
