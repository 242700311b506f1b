"""`scale` without Slurm: every size runs here, one after another; status and results read the study."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from conftest import slurmddp

ROOT = Path(__file__).resolve().parents[2]


def test_a_local_study_reports_every_size_and_status_and_results_read_it(tmp_path: Path) -> None:
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    out = tmp_path / "runs"
    proc = slurmddp(
        env,
        tmp_path,
        "scale",
        str(ROOT / "examples" / "sleep_compute.yaml"),
        "--nodes",
        "1,2",
        "--steps",
        "12",
        "--bucket-cap-mb",
        "2,50",
        "executor=local",
        f"output_dir={out}",
        "train.compute_ms=60",
        "telemetry.every_s=0.5",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (study,) = [p.parent for p in out.glob("*/*/sweep.json")]
    rows = list(csv.DictReader((study / "study.csv").open()))
    assert [(r["label"], r["ranks"], r["bucket_cap_mb"], r["state"]) for r in rows] == [
        ("1 node (baseline)", "1", "", "COMPLETED"),
        ("2 nodes", "2", "", "COMPLETED"),
        ("2 nodes, bucket 2 MB", "2", "2.0", "COMPLETED"),
        ("2 nodes, bucket 50 MB", "2", "50.0", "COMPLETED"),
    ]
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[1]["efficiency"]) > 0
    # 4 layers of 1024x1024 floats (16 MB): 2 MB buckets are more than 50 MB ones.
    buckets = [
        json.loads((study / e["dir"] / "result.json").read_text())["telemetry"]["buckets"]
        for e in json.loads((study / "sweep.json").read_text())["elements"][2:]
    ]
    assert buckets[0] > buckets[1] >= 1, buckets
    assert "bucket_cap_mb: " in proc.stdout and "gives the highest throughput at 2 ranks" in proc.stdout
    assert (study / "study.png").read_bytes().startswith(b"\x89PNG")
    status = slurmddp(env, tmp_path, "status", str(study))
    assert status.returncode == 0, status.stderr
    # Every element's throughput; in steps: the workload has no ctx.loader to count samples by.
    assert status.stdout.count(" steps/s") == 4, status.stdout
    again = slurmddp(env, tmp_path, "results", str(study))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == proc.stdout[proc.stdout.index("index  element") :].splitlines()[0]
