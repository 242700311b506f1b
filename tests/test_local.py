"""The no-cluster path: `submit` with the local executor runs real gloo ranks on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def submit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", *args, "executor=local", f"output_dir={cwd / 'runs'}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_local_quickstart_completes_with_identical_ranks(tmp_path: Path) -> None:
    proc = submit(tmp_path, str(ROOT / "examples" / "quickstart.yaml"), "train.steps=20", "resources.nodes=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended COMPLETED" in proc.stdout
    (result_file,) = (tmp_path / "runs").glob("quickstart/*/result.json")
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
