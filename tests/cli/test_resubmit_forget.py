"""`resubmit --forget-exclusions` hands the choice to the resubmission of a run and of a sweep's
failed elements, and prints what was forgotten; the resubmissions themselves are replaced
(tests/manage/test_exclusions.py checks what they do with it)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from slurmddp.cli.main import main
from slurmddp.manage import actions
from slurmddp.submit import submitter


def test_a_run_is_resubmitted_forgetting_its_exclusions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"executor": "slurm", "job_id": "4242", "logs": str(run)}))
    asked: list[tuple[Any, ...]] = []

    def resubmit_run(ref: str, overrides: list[str], argv: list[str], forget: bool = False) -> Any:
        asked.append((ref, overrides, forget))
        plan = SimpleNamespace(run_dir=run, job_name="exp", executor="slurm", world_size=2)
        sub = submitter.Submission(plan, SimpleNamespace(job_id="4343"), {})  # type: ignore[arg-type]
        return actions.Resubmitted(sub, [], ["no longer leaves out node2 (an ECC error)"])

    monkeypatch.setattr(actions, "resubmit_run", resubmit_run)
    assert main(["resubmit", "--forget-exclusions", "--no-wait", str(run), "resources.time=01:00:00"]) == 0
    assert asked == [(str(run), ["resources.time=01:00:00"], True)]
    assert "slurmddp: no longer leaves out node2 (an ECC error)\n" in capsys.readouterr().out
    assert main(["resubmit", "--no-wait", str(run)]) == 0
    assert asked[-1] == (str(run), [], False)


def test_a_sweeps_failed_elements_are_resubmitted_forgetting_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"executor": "slurm", "submissions": [], "elements": []}))
    asked: list[bool] = []

    def resubmit_failed(ref: str, argv: list[str], forget: bool = False) -> actions.ResubmittedElements:
        asked.append(forget)
        return actions.ResubmittedElements("4344", [1], [])

    monkeypatch.setattr(actions, "resubmit_failed", resubmit_failed)
    assert main(["resubmit", "--failed", "--forget-exclusions", str(sweep)]) == 0
    assert asked == [True]
