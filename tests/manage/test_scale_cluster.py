"""`scale` on the real lab: weak scaling of a sleep-compute workload over 1-3 nodes, checked against
the jobs' own step records and a plain all-reduce; a slowed link named; a too-large size refused."""

from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import slurmddp
from omegaconf import OmegaConf

from slurmddp.experiment.study import BATCH_KEY

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("24.11")]

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "sleep_compute.yaml"
WARMUP = 3  # telemetry.warmup_steps' default: the same steps are left out of the own figures
_TRAIN = OmegaConf.load(WORKLOAD).train
BEFORE_FIRST_BUCKET_S = _TRAIN.compute_ms / 1000 * (1 / 3 + 2 / 3 / _TRAIN.layers)
"""Forward's sleep (a third of the compute) and the last layer's backward (its share of the
other two thirds): examples/sleep_compute.py."""


def study_dir(out: Path) -> Path:
    found = sorted(p.parent for p in out.glob("*/*/sweep.json"))
    assert len(found) == 1, found
    return found[0]


def own_step_s(run: Path) -> float:
    """The mean time between the ends of two steps after the warm-up, from the workload's own
    record: samples over seconds, as the tool counts throughput (a median left out the slow
    steps the tool counts, and differed from it by 4 points once)."""
    times = [float(line.split()[1]) for line in (run / "own_steps.txt").read_text().splitlines()]
    return (times[-1] - times[WARMUP]) / (len(times) - 1 - WARMUP)


def scale(env: dict[str, str], tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp / "runs"
    proc = slurmddp(
        env,
        tmp,
        "scale",
        str(WORKLOAD),
        *args,
        "profile=lab",
        f"output_dir={out}",
        "telemetry.every_s=2",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, study_dir(out)


def test_weak_scaling_agrees_with_the_jobs_own_step_records(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    proc, study = scale(slurm_env, tmp_path, "--nodes", "1,2,3", "--steps", "40")
    rows = list(csv.DictReader((study / "study.csv").open()))
    assert [(r["nodes"], r["ranks"], r["state"]) for r in rows] == [
        ("1", "1", "COMPLETED"),
        ("2", "2", "COMPLETED"),
        ("3", "3", "COMPLETED"),
    ]
    assert (study / "study.png").read_bytes().startswith(b"\x89PNG")
    manifest = json.loads((study / "sweep.json").read_text())
    dirs = [study / e["dir"] for e in manifest["elements"]]
    batches = [e["overrides"][f"train.{BATCH_KEY}"] for e in manifest["elements"]]
    assert batches == [8, 16, 24]  # weak: the batch per rank is kept
    own = [batch / own_step_s(run) for batch, run in zip(batches, dirs, strict=True)]
    shown = []
    for row, ranks, throughput in zip(rows, (1, 2, 3), own, strict=True):
        own_efficiency = throughput / own[0] / ranks
        shown.append((float(row["efficiency"]), own_efficiency))
        assert abs(float(row["efficiency"]) - own_efficiency) < 0.05, shown
    print(proc.stdout)
    print("efficiency (tool, own records):", shown)
    for run, ranks in zip(dirs[1:], (2, 3), strict=True):
        result = json.loads((run / "result.json").read_text())
        telemetry, plain = result["telemetry"], result["result"]["allreduce_s"]
        assert result["num_nodes"] == telemetry["world_size"] == ranks
        assert telemetry["bucket_bytes"] == result["result"]["bucket_bytes"]
        # DDP's all-reduces of the same buckets, overlapped with backward and with one another,
        # against the same all-reduces run one by one after a barrier on idle ranks. The fastest
        # rank's time is the transfer; the mean adds the ranks' wait for one another. Seen on a
        # quiet 2-core lab: 1.0-2.3 times the plain timing (docs/scaling.md); 3.2 with three other
        # labs on the same cores, which slow the overlapped all-reduces more than the plain ones
        # timed after training. So the plain timing bounds it from below only: a timer that
        # stopped at the launch would be near 0.
        comm, fastest = telemetry["comm_s"], telemetry["comm_min_s"]
        print(
            f"{ranks} ranks: comm_s {comm:.4f} s, comm_min_s {fastest:.4f} s, plain all-reduces {plain:.4f} s"
        )
        assert fastest / plain > 0.5, (fastest, plain)
        # From above, a bound no load moves: the first bucket is ready only after forward and the
        # last layer's backward slept, so a timer that ran over the whole step, or from the start
        # of backward, would come within that much of the step.
        assert fastest < telemetry["step_s"] - BEFORE_FIRST_BUCKET_S, (fastest, telemetry["step_s"])
        assert fastest <= comm
    assert "weak scaling" in proc.stdout


@pytest.fixture
def slow_node3(slurm_env: dict[str, str]) -> Iterator[str]:
    """Both directions of node3's link limited to 100 Mbit/s: the bridge side of its veth and
    its own eth0, inside the lab's namespace (each lab names its own: tests/slurm_lab/up)."""
    netns, veth = slurm_env["SLURMDDP_LAB_NETNS_PREFIX"], slurm_env["SLURMDDP_LAB_VETH_PREFIX"]
    devices = [["tc"], ["nsenter", f"--net=/run/netns/{netns}node3", "tc"]]
    names = [f"{veth}3", "eth0"]
    for tc, dev in zip(devices, names, strict=True):
        subprocess.run(
            [
                *tc,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                "100mbit",
                "burst",
                "64kb",
                "latency",
                "400ms",
            ],
            check=True,
        )
    try:
        yield "node3"
    finally:
        for tc, dev in zip(devices, names, strict=True):
            subprocess.run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)


def test_a_slowed_link_is_named_with_communication(
    slurm_env: dict[str, str], slow_node3: str, tmp_path: Path
) -> None:
    proc, study = scale(slurm_env, tmp_path, "--nodes", "1,3", "--steps", "12")
    rows = list(csv.DictReader((study / "study.csv").open()))
    assert float(rows[-1]["efficiency"]) < 0.5, rows
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith("  3 nodes:")]
    assert any("communication is not hidden" in line for line in verdicts), proc.stdout
    assert any("slow links on node3" in line and "resources.exclude=node3" in line for line in verdicts), (
        proc.stdout
    )
    print(proc.stdout)


def test_a_size_larger_than_the_cluster_is_refused_and_nothing_submitted(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    proc = slurmddp(
        slurm_env, tmp_path, "scale", str(WORKLOAD), "--nodes", "1,4", "profile=lab", f"output_dir={out}"
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "4 nodes, but debug has 3" in proc.stderr, proc.stderr
    assert not out.exists()
