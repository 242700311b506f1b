"""The no-cluster path: `submit` with the local executor runs real gloo ranks on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def submit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", *args, "executor=local", f"output_dir={cwd / 'runs'}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_local_quickstart_completes_with_identical_ranks(tmp_path: Path) -> None:
    proc = submit(tmp_path, str(ROOT / "examples" / "synthetic.yaml"), "train.steps=20", "resources.nodes=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended COMPLETED" in proc.stdout
    (result_file,) = (tmp_path / "runs").glob("synthetic/*/result.json")
    result = json.loads(result_file.read_text())
    assert result["world_size"] == 2 and len({r["param_sha256"] for r in result["ranks"]}) == 1
    assert result["result"]["steps"] == 20


def test_a_failing_rank_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text(
        "def main(ctx):\n    if ctx.rank == 1:\n        raise RuntimeError('rank 1 gave up')\n    return {}\n"
    )
    exp = tmp_path / "boom.yaml"
    exp.write_text("entrypoint: boom.py:main\nresources:\n  tasks_per_node: 2\ndist:\n  timeout_s: 20\n")
    proc = submit(tmp_path, str(exp))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ended FAILED" in proc.stdout
    assert not list((tmp_path / "runs").glob("boom/*/result.json"))


def test_a_local_sweep_runs_its_elements_one_after_another(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(
        "def main(ctx):\n"
        "    for step in ctx.loop(ctx.train.steps):\n"
        "        ctx.log(step, value=ctx.train.scale * step)\n"
        "    return {'scale': ctx.train.scale}\n"
    )
    exp = tmp_path / "two.yaml"
    exp.write_text(
        "entrypoint: steps.py:main\nresources: {tasks_per_node: 2}\ntrain: {steps: 5, scale: 1}\n"
        "sweep: {list: [{scale: 2}, {scale: 3}], metric: value, mode: max}\n"
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(exp),
            "executor=local",
            f"output_dir={tmp_path / 'runs'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 completed" in proc.stdout
    status = subprocess.run(
        [sys.executable, "-m", "slurmddp", "status", "--json"], env=env, capture_output=True, text=True
    )
    rows = json.loads(status.stdout)["elements"]
    assert [(r["state"], r["overrides"], r["metrics"]["value"]) for r in rows] == [
        ("COMPLETED", {"train.scale": 2}, 8.0),
        ("COMPLETED", {"train.scale": 3}, 12.0),
    ]
    results = subprocess.run(
        [sys.executable, "-m", "slurmddp", "results", rows[0]["dir"]], env=env, capture_output=True, text=True
    )
    assert results.returncode == 0, results.stderr
    assert [line.split()[0] for line in results.stdout.splitlines()[1:3]] == ["1", "0"]  # max first
    for row, scale in zip(rows, (2, 3), strict=True):
        assert json.loads((Path(row["dir"]) / "result.json").read_text())["result"] == {"scale": scale}
        (record,) = (Path(row["dir"]) / "provenance").glob("*.json")
        assert json.loads(record.read_text())["config"]["train"]["scale"] == scale
