"""How a run or a sweep was submitted: RUN_DIR/manifest.json (RunManifest) and SWEEP_DIR/sweep.json
(SweepManifest, with its elements and its submissions), each with its read and its write.

The submit commands write them, the login-node commands read them back (manage/runs.py), and a
sweep's batch script looks its element up in sweep.json. A key an earlier version did not write
reads as None and is left out again when the record is written back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmddp.errors import SlurmddpError
from slurmddp.files import write_json
from slurmddp.rundir.layout import MANIFEST, SWEEP


def _without_none(data: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if value is not None}


def _read(path: Path) -> dict[str, Any]:
    """The manifest at `path`; a SlurmddpError naming it when it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SlurmddpError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SlurmddpError(f"cannot read {path}: it holds no JSON object")
    return data


@dataclass(frozen=True)
class Dependency:
    """`submit --after RUN` (`afterok`) or `--after-any RUN` (`afterany`): the run or sweep this one
    waits for in the queue, and its jobs as they were at submit."""

    kind: str
    """Slurm's dependency type: "afterok" or "afterany"."""
    dir: str
    """The run or sweep directory waited for."""
    jobs: list[str]

    @classmethod
    def from_json(cls, data: Any) -> Dependency | None:
        if not isinstance(data, dict):
            return None
        return cls(str(data["kind"]), str(data["dir"]), [str(job) for job in data.get("jobs", ())])

    @property
    def sbatch(self) -> str:
        """sbatch's --dependency value."""
        return f"{self.kind}:{':'.join(self.jobs)}"


@dataclass(frozen=True, kw_only=True)
class Submitted:
    """What a run's or a sweep's manifest says of how it was submitted."""

    name: str | None = None
    executor: str | None = None
    """"slurm" or "local"; None in manifests written before they named one (those ran on Slurm)."""
    submitted_at: str | float | None = None
    """ISO time (seconds) of the submission."""
    experiment: str | None = None
    """The experiment file, resolved: relative entrypoints are looked up from its directory."""
    overrides: list[str] | None = None
    argv: list[str] | None = None
    workdir: str | None = None
    run_dir: str | None = None
    world_size: int | None = None
    logs: str | None = None
    """submitit's folder of the job's batch script, pickles and per-rank logs."""
    after: Dependency | None = None
    """What the job waits for in the queue (`submit --after`); None: nothing."""

    def _submitted_json(self) -> dict[str, Any]:
        fields = submitted_fields(self)
        fields["after"] = None if self.after is None else dataclasses.asdict(self.after)
        return _without_none(fields)


def submitted_fields(record: Submitted) -> dict[str, Any]:
    """The fields of how `record` was submitted, by name: what a manifest is built from."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(Submitted)}


def _submitted_from(data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": data.get("name"),
        "executor": data.get("executor"),
        "submitted_at": data.get("submitted_at"),
        "experiment": data.get("experiment"),
        "overrides": data.get("overrides"),
        "argv": data.get("argv"),
        "workdir": data.get("workdir"),
        "run_dir": data.get("run_dir"),
        "world_size": data.get("world_size"),
        "logs": data.get("logs"),
        "after": Dependency.from_json(data.get("after")),
    }


@dataclass(frozen=True, kw_only=True)
class RunManifest(Submitted):
    """RUN_DIR/manifest.json: a run's submission, and each resubmission's job."""

    job_id: str
    """The current job."""
    previous_jobs: list[str] | None = None
    """The jobs of earlier submissions, oldest first (a resubmitted run)."""
    resubmitted_at: str | None = None
    resubmit_argv: list[str] | None = None

    @classmethod
    def of(cls, submitted: Submitted, job_id: str) -> RunManifest:
        return cls(**submitted_fields(submitted), job_id=job_id)

    @property
    def jobs(self) -> tuple[str, ...]:
        """Every job the run has had, the current one last."""
        return (*map(str, self.previous_jobs or ()), self.job_id)

    def resubmitted(self, job_id: str, world_size: int, at: str, argv: list[str]) -> RunManifest:
        """The manifest once job `job_id` was submitted again in the run's directory."""
        return dataclasses.replace(
            self,
            job_id=job_id,
            previous_jobs=[*(self.previous_jobs or ()), self.job_id],
            world_size=world_size,
            resubmitted_at=at,
            resubmit_argv=argv,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunManifest:
        previous = data.get("previous_jobs")
        return cls(
            **_submitted_from(data),
            job_id=str(data["job_id"]),
            previous_jobs=None if previous is None else list(previous),
            resubmitted_at=data.get("resubmitted_at"),
            resubmit_argv=data.get("resubmit_argv"),
        )

    def to_json(self) -> dict[str, Any]:
        resubmit = {
            "previous_jobs": self.previous_jobs,
            "resubmitted_at": self.resubmitted_at,
            "resubmit_argv": self.resubmit_argv,
        }
        return {**self._submitted_json(), "job_id": self.job_id, **_without_none(resubmit)}

    @classmethod
    def read(cls, run_dir: Path) -> RunManifest:
        """The run's manifest; a SlurmddpError naming the file when it cannot be read."""
        return cls.from_json(_read(run_dir / MANIFEST))

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / MANIFEST, self.to_json())


@dataclass(frozen=True)
class StudySize:
    """What a scaling study's element measures (experiment/study.py's Element)."""

    role: str
    label: str
    nodes: int
    ranks: int
    bucket_cap_mb: float | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudySize | None:
        if "role" not in data:
            return None
        return cls(
            str(data["role"]), str(data["label"]), data["nodes"], data["ranks"], data.get("bucket_cap_mb")
        )


@dataclass(frozen=True)
class ElementEntry:
    """One element of a sweep: its index, its directory (under the sweep's) and its overrides."""

    index: int
    dir: str
    overrides: dict[str, Any]
    size: StudySize | None = None
    """A scaling study's element: the size it measures; None in a sweep."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ElementEntry:
        return cls(
            data["index"], str(data["dir"]), dict(data.get("overrides") or {}), StudySize.from_json(data)
        )

    def to_json(self) -> dict[str, Any]:
        size = {} if self.size is None else vars(self.size)
        return {"index": self.index, "dir": self.dir, "overrides": self.overrides, **size}


@dataclass(frozen=True)
class SweepSubmission:
    """One submission of a sweep's elements (an array, or one element's own job)."""

    elements: list[int]
    """The indices of the elements, in the order of the array's tasks."""
    job_id: str | None
    """None until sbatch returned (an array task may start before it does)."""
    submitted_at: float | str | None = None
    logs: str | None = None
    """submitit's folder of this submission; None in sweeps written before each had its own."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepSubmission:
        job_id = data.get("job_id")
        return cls(
            list(data.get("elements", ())),
            None if job_id is None else str(job_id),
            data.get("submitted_at"),
            data.get("logs"),
        )

    def to_json(self) -> dict[str, Any]:
        known = {"submitted_at": self.submitted_at, "logs": self.logs}
        return {"elements": self.elements, "job_id": self.job_id, **_without_none(known)}


@dataclass(frozen=True)
class StudySettings:
    """A scaling study's own settings, in its sweep.json."""

    mode: str | None
    """"weak" or "strong"."""
    batch_key: str | None
    """The config key of the global batch, which weak scaling grows with the ranks."""

    @classmethod
    def from_json(cls, data: Any) -> StudySettings | None:
        if not isinstance(data, dict):
            return None
        return cls(data.get("mode"), data.get("batch_key"))


@dataclass(frozen=True, kw_only=True)
class SweepManifest(Submitted):
    """SWEEP_DIR/sweep.json: a sweep (or a scaling study), its elements and every submission."""

    max_parallel: int | None = None
    metric: str | None = None
    """The metric `results` ranks by; None: the first one logged."""
    mode: str | None = None
    """"min" or "max": which end of `metric` is best."""
    keys: list[str] = field(default_factory=list)
    """The config keys the elements vary."""
    elements: list[ElementEntry] = field(default_factory=list)
    submissions: list[SweepSubmission] = field(default_factory=list)
    study: StudySettings | None = None
    """A scaling study's settings; None for a sweep."""
    then: str | None = None
    """`sweep.then`: the experiment file submitted once the sweep ended (by its `then` job on
    Slurm, at the end of a local sweep)."""
    then_job: str | None = None
    """The job that submits `then` once every array job ended; None before it was queued."""
    search: dict[str, Any] | None = None
    """A `search:` sweep's study: `study` (the Optuna study's name), `storage` (its URL, or the
    journal file's absolute path), both resolved at submit, and `spec`, experiment/search.py's
    `Search.to_json()`; None for other sweeps."""

    def with_submission(self, submission: SweepSubmission) -> SweepManifest:
        return dataclasses.replace(self, submissions=[*self.submissions, submission])

    def without_last_submission(self) -> SweepManifest:
        return dataclasses.replace(self, submissions=self.submissions[:-1])

    def with_last_job(self, job_id: str) -> SweepManifest:
        """The last submission's job id recorded, once sbatch returned it."""
        last = dataclasses.replace(self.submissions[-1], job_id=job_id)
        return dataclasses.replace(self, submissions=[*self.submissions[:-1], last])

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepManifest:
        return cls(
            **_submitted_from(data),
            max_parallel=data.get("max_parallel"),
            metric=data.get("metric"),
            mode=data.get("mode"),
            keys=list(data.get("keys") or []),
            elements=[ElementEntry.from_json(e) for e in data.get("elements", ())],
            submissions=[SweepSubmission.from_json(s) for s in data.get("submissions", ())],
            study=StudySettings.from_json(data.get("study")),
            search=data.get("search"),
            then=data.get("then"),
            then_job=data.get("then_job"),
        )

    def to_json(self) -> dict[str, Any]:
        study = {} if self.study is None else {"study": vars(self.study)}
        search = {} if self.search is None else {"search": self.search}
        then = {key: getattr(self, key) for key in ("then", "then_job") if getattr(self, key) is not None}
        return {
            **self._submitted_json(),
            "kind": "sweep",
            "max_parallel": self.max_parallel,
            "metric": self.metric,
            "mode": self.mode,
            "keys": self.keys,
            "elements": [e.to_json() for e in self.elements],
            "submissions": [s.to_json() for s in self.submissions],
            **study,
            **search,
            **then,
        }

    @classmethod
    def read(cls, sweep_dir: Path) -> SweepManifest:
        """The sweep's manifest; a SlurmddpError naming the file when it cannot be read."""
        return cls.from_json(_read(sweep_dir / SWEEP))

    def write(self, sweep_dir: Path) -> None:
        write_json(sweep_dir / SWEEP, self.to_json())
