"""`status` on a folder of runs shows its newest, and `results --json` writes only what is named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmddp.cli.main import main


def local_run(run_dir: Path, job_id: str, age_s: float = 0) -> Path:
    """A finished local run as status reads it: its manifest and result (older by `age_s`)."""
    run_dir.mkdir(parents=True)
    manifest = run_dir / "manifest.json"
    manifest.write_text(json.dumps({"executor": "local", "job_id": job_id, "logs": str(run_dir / "logs")}))
    (run_dir / "result.json").write_text("{}")
    stamp = manifest.stat().st_mtime - age_s
    os.utime(manifest, (stamp, stamp))
    return run_dir


def local_sweep(root: Path) -> Path:
    """A finished local sweep of two elements, each with a logged loss."""
    elements = []
    for index, loss in enumerate((0.5, 0.25)):
        name = f"00{index}-abcdef"
        local_run(root / name, str(100 + index))
        (root / name / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": loss}) + "\n")
        elements.append({"index": index, "dir": name, "overrides": {"train.lr": 0.1 * (index + 1)}})
    manifest = {
        "kind": "sweep",
        "name": "s",
        "executor": "local",
        "logs": str(root / "logs"),
        "metric": "loss",
        "mode": "min",
        "keys": ["train.lr"],
        "elements": elements,
        "submissions": [],
    }
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def shown_job(capsys: pytest.CaptureFixture[str]) -> str:
    return str(json.loads(capsys.readouterr().out)["elements"][0]["job_id"])


def test_status_of_a_folder_of_runs_shows_the_newest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    local_run(runs / "a" / "20260101-000000-aaaa", "11", age_s=60)
    local_run(runs / "b" / "20260101-000100-bbbb", "22")
    local_run(runs / "a" / "20260101-000200-cccc", "33", age_s=30)
    assert main(["status", str(runs), "--json"]) == 0
    assert shown_job(capsys) == "22"
    assert main(["status", str(runs / "a"), "--json"]) == 0
    assert shown_job(capsys) == "33"


def test_a_sweep_counts_as_one_run_of_the_folder_not_its_elements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local_run(tmp_path / "runs" / "single" / "20260101-000000-aaaa", "11", age_s=60)
    sweep = local_sweep(tmp_path / "runs" / "sweep" / "20260101-000100-bbbb")
    assert main(["status", str(tmp_path / "runs"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dir"] == str(sweep)


def test_a_folder_without_runs_is_refused_with_what_was_looked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"slurmddp: error: {tmp_path} holds no slurmddp run: no manifest.json or sweep.json in it or in "
        "the two levels of folders below it; name a run directory\n"
    )


def test_results_json_writes_no_csv_unless_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = local_sweep(tmp_path / "sweep")
    assert main(["results", str(sweep), "--json"]) == 0
    assert [row["index"] for row in json.loads(capsys.readouterr().out)] == [1, 0]
    assert not (sweep / "results.csv").exists()
    named = tmp_path / "named.csv"
    assert main(["results", str(sweep), "--json", "--csv", str(named)]) == 0
    assert named.read_text().splitlines()[0].startswith("index,")
    assert main(["results", str(sweep)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"slurmddp: wrote {sweep / 'results.csv'}"
    assert (sweep / "results.csv").is_file()


def test_results_names_its_ranking_and_winner_and_keeps_another_metrics_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `results --metric` once replaced results.csv without a word, and no line said whether the
    # ranking took each element's last value or its best, or which element won.
    sweep = local_sweep(tmp_path / "sweep")
    assert main(["results", str(sweep)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-2] == (
        "slurmddp: ranked by the last loss each element logged, lowest first; "
        "best: element 1 (lr=0.2), loss 0.25 at step 10"
    )
    own = (sweep / "results.csv").read_text()
    assert main(["results", str(sweep), "--mode", "max"]) == 0
    other = sweep / "results-loss-max.csv"
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == f"slurmddp: wrote {other}" and "highest first; best: element 0" in said[-2]
    assert (sweep / "results.csv").read_text() == own
    assert [line.split(",")[0] for line in other.read_text().splitlines()[1:]] == ["0", "1"]
    assert main(["results", str(sweep), "--metric", "loss", "--mode", "min"]) == 0  # the sweep's own
    assert capsys.readouterr().out.splitlines()[-1] == f"slurmddp: wrote {sweep / 'results.csv'}"
