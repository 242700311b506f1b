"""The nodes a run left out for good (excluded.json): `status` names each with why, and `resubmit
--forget-exclusions` forgets them while the user's own resources.exclude stays. Those set aside for
one allocation only (suspected) `status` shows as such, and a resubmit does not carry. The
submission itself is replaced: what it is handed is what is checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from slurmddp import yamlio
from slurmddp.errors import SubmitError
from slurmddp.experiment.load import Loaded, load_experiment
from slurmddp.manage import actions, report, runs
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, Exclusions, Failure
from slurmddp.submit import submitter

EXPERIMENT = ROOT / "templates" / "experiment.yaml"
JOB = "999999999"
"""A local job's id is its process id: this one is no process, so the run reads as ended."""
WHY = "rank 3, cuda:1: cudaErrorECCUncorrectable (214): AcceleratorError('CUDA error: uncorrectable ECC')"


def failed_run(tmp_path: Path, exclude: str) -> Path:
    """A run that failed after leaving node2 out, whose config.yaml says resources.exclude=`exclude`
    (an earlier resubmit writes the hosts left out there, beside the user's own)."""
    run = tmp_path / "runs" / "exp" / "1"
    (run / "logs").mkdir(parents=True)
    loaded = load_experiment(EXPERIMENT, ["executor=local", f"resources.exclude={exclude}"])
    (run / "config.yaml").write_text(yamlio.dump(loaded.resolved))
    manifest = {
        "job_id": JOB,
        "logs": str(run / "logs"),
        "executor": "local",
        "world_size": 1,
        "name": "exp",
        "workdir": str(tmp_path),
        "experiment": str(EXPERIMENT),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    Failure(7, 3, "AcceleratorError(...)", AttemptId(JOB, 0), 1.0, bad_hosts={"node2": WHY}).write(run)
    Exclusions().adding({"node2": WHY}, 0, 2.0).write(run)
    return run


class Submitted:
    """submitter.resubmit's place: what it was handed, and what the run directory held then."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.loaded: Loaded | None = None
        self.left_out_then: set[str] | None = None

    def __call__(self, plan: Any, loaded: Loaded, manifest: dict[str, Any], argv: list[str]) -> Any:
        self.loaded, self.left_out_then = loaded, set(Exclusions.read(plan.run_dir).hosts)
        if self.refuse:
            raise SubmitError("sbatch refused the job; nothing was submitted")
        return submitter.Submission(plan=plan, job=None, manifest=manifest)


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> Submitted:
    fake = Submitted()
    monkeypatch.setattr(submitter, "resubmit", fake)
    return fake


def test_status_names_each_host_left_out_and_why(tmp_path: Path) -> None:
    run = failed_run(tmp_path, "node9")
    target = runs.load(run)
    rows = runs.rows(target)
    text = report.status_table(target, rows, None)
    assert f"\nrun: leaves out node2: {WHY}\n" in text
    assert "`resubmit --forget-exclusions` forgets them" in text
    assert report.status_json(target, rows)["elements"][0]["excluded"] == {"node2": WHY}


SUSPECTED = "its 2 ranks died together while the other nodes' ran on"


def with_suspects(run: Path, lasting: bool = True) -> None:
    """The run's latest attempt (the requeued allocation's restart) began after node3 was set aside
    in its allocation; node4 was set aside in the allocation before it."""
    for number, attempt in enumerate([AttemptId(JOB, 0), AttemptId(JOB, 1), AttemptId(JOB, 1, 1)]):
        records.append_attempt(run, Begin(number, 1.0, "node1", "node[1-4]", attempt))
    excluded = Exclusions().adding({"node2": WHY}, 0, 2.0) if lasting else Exclusions()
    excluded = excluded.setting_aside({"node4": SUSPECTED}, 0, 2.0, f"{JOB}.0")
    excluded.setting_aside({"node3": SUSPECTED}, 1, 3.0, f"{JOB}.1").write(run)


def test_status_says_which_hosts_are_left_out_of_this_allocation_only(tmp_path: Path) -> None:
    run = failed_run(tmp_path, "node9")
    with_suspects(run)
    target = runs.load(run)
    rows = runs.rows(target)
    text = report.status_table(target, rows, None)
    assert f"\nrun: leaves out node2: {WHY}\n" in text
    assert f"\nrun: leaves out node3: {SUSPECTED} (this allocation only: suspected, not confirmed)\n" in text
    assert "node4" not in text  # an earlier allocation's suspect is no longer left out
    assert report.status_json(target, rows)["elements"][0]["excluded"] == {
        "node2": WHY,
        "node3": f"{SUSPECTED} (this allocation only: suspected, not confirmed)",
    }
    assert "--forget-exclusions` forgets them" in text


def test_status_of_suspects_alone_offers_nothing_to_forget(tmp_path: Path) -> None:
    run = failed_run(tmp_path, "node9")
    with_suspects(run, lasting=False)
    target = runs.load(run)
    text = report.status_table(target, runs.rows(target), None)
    assert "run: leaves out node3: " in text and "forget" not in text


def test_a_resubmit_does_not_carry_a_host_set_aside_for_one_allocation(
    tmp_path: Path, submitted: Submitted
) -> None:
    run = failed_run(tmp_path, "node9")
    with_suspects(run)
    done = actions.resubmit_run(str(run), [], ["resubmit"])
    assert submitted.loaded is not None
    assert submitted.loaded.experiment.resources.exclude == "node2,node9"
    assert done.notes == [f"leaves out node2: {WHY}"]


def test_status_of_a_run_that_left_nothing_out_says_nothing_of_it(tmp_path: Path) -> None:
    run = failed_run(tmp_path, "node9")
    Exclusions().write(run)
    target = runs.load(run)
    text = report.status_table(target, runs.rows(target), None)
    assert "leaves out" not in text and "forget" not in text


def test_a_resubmit_goes_on_leaving_out_what_the_run_left_out(tmp_path: Path, submitted: Submitted) -> None:
    run = failed_run(tmp_path, "node9")
    done = actions.resubmit_run(str(run), [], ["resubmit"])
    assert submitted.loaded is not None
    assert submitted.loaded.experiment.resources.exclude == "node2,node9"
    assert f"leaves out node2: {WHY}" in done.notes
    assert set(Exclusions.read(run).hosts) == {"node2"}


def test_forgetting_clears_the_hosts_left_out_before_the_job_starts(
    tmp_path: Path, submitted: Submitted
) -> None:
    # node2 came into resources.exclude with an earlier resubmit; node9 is the user's own.
    run = failed_run(tmp_path, "node2,node9")
    done = actions.resubmit_run(str(run), [], ["resubmit", "--forget-exclusions"], forget_exclusions=True)
    assert submitted.left_out_then == set()  # the job's first attempt reads excluded.json
    assert submitted.loaded is not None
    assert submitted.loaded.experiment.resources.exclude == "node9"
    assert done.changed == ["resources.exclude"]
    assert f"no longer leaves out node2 ({WHY})" in done.notes
    assert Exclusions.read(run).hosts == {}
    target = runs.load(run)
    assert "leaves out" not in report.status_table(target, runs.rows(target), None)


def test_forgetting_unsets_an_exclude_of_only_hosts_left_out(tmp_path: Path, submitted: Submitted) -> None:
    run = failed_run(tmp_path, "node2")
    actions.resubmit_run(str(run), [], ["resubmit"], forget_exclusions=True)
    assert submitted.loaded is not None and submitted.loaded.experiment.resources.exclude is None
    assert submitted.loaded.resolved["resources"]["exclude"] is None


def test_an_exclude_given_with_the_resubmit_stands_as_given(tmp_path: Path, submitted: Submitted) -> None:
    run = failed_run(tmp_path, "node9")
    actions.resubmit_run(str(run), ["resources.exclude=node2,node5"], ["resubmit"], forget_exclusions=True)
    assert submitted.loaded is not None
    assert submitted.loaded.experiment.resources.exclude == "node2,node5"
    assert Exclusions.read(run).hosts == {}


def test_a_refused_resubmission_forgets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = failed_run(tmp_path, "node9")
    refused = Submitted(refuse=True)
    monkeypatch.setattr(submitter, "resubmit", refused)
    with pytest.raises(SubmitError):
        actions.resubmit_run(str(run), [], ["resubmit"], forget_exclusions=True)
    assert refused.left_out_then == set()
    assert Exclusions.read(run).hosts["node2"].reason == WHY
