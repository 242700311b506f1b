"""The job-start check: the verdict over gathered reports (pure), its config, and real gloo ranks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from slurmddp.errors import ConfigError
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Preflight
from slurmddp.job.allocation import outcome, requeue
from slurmddp.job.process import preflight
from slurmddp.job.process.preflight import Link, RankReport
from slurmddp.rundir.records import AttemptId, Failure

MB4 = 4 * 2**20


def reports(hosts: list[str], ring_s: dict[int, float] | None = None, **changes: object) -> list[RankReport]:
    """One report per rank on `hosts` (in rank order), each receiving from the previous rank."""
    world = len(hosts)
    out = []
    for rank, host in enumerate(hosts):
        fields: dict[str, object] = {
            "rank": rank,
            "host": host,
            "sum_ok": True,
            "allreduce_s": 0.004,
            "ring_from": (rank - 1) % world,
            "ring_s": (ring_s or {}).get(rank, 0.004),
        }
        fields.update({k: v(rank) if callable(v) else v for k, v in changes.items()})
        out.append(RankReport(**fields))  # type: ignore[arg-type]
    return out


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # 4 MiB in 4 ms over 4 ranks: algbw 8.39 Gb/s, times 2*3/4.
    assert preflight.bus_gbps(MB4, 0.004, 4) == pytest.approx(MB4 * 8 / 0.004 / 1e9 * 1.5)
    assert preflight.bus_gbps(MB4, 0.004, 1) == 0.0


def test_contributions_sum_exactly_in_float32() -> None:
    import torch

    world = 1000
    total = torch.zeros(4)
    for rank in range(world):
        total += preflight.contribution(rank)
    assert bool(torch.all(total == preflight.expected_sum(world)))


def test_a_healthy_job_passes_and_lists_only_links_between_hosts() -> None:
    verdict = preflight.verdict(reports(["n1", "n1", "n2", "n2"]), Preflight(), MB4, 2)
    assert verdict.ok and verdict.suspects == ()
    # In order of the receiving rank: rank 0 receives from rank 3 (n2), rank 2 from rank 1 (n1).
    assert [(link.src, link.dst) for link in verdict.links] == [("n2", "n1"), ("n1", "n2")]
    assert "bus" in verdict.message and "n1->n2" in verdict.message


def test_a_forced_host_fails_by_name() -> None:
    verdict = preflight.verdict(
        reports(["n1", "n2"], forced=lambda r: r == 1), Preflight(fail_on_host="n2"), MB4, 2
    )
    assert not verdict.ok and verdict.suspects == ("n2",)
    assert verdict.message.startswith("n2: failed on purpose (preflight.fail_on_host=n2)")


def test_a_wrong_sum_names_where_it_was_seen() -> None:
    verdict = preflight.verdict(reports(["n1", "n2"], sum_ok=lambda r: r != 1), Preflight(), MB4, 2)
    assert not verdict.ok and verdict.suspects == ("n2",) and "wrong sum on ranks 1" in verdict.message
    everywhere = preflight.verdict(reports(["n1", "n2"], sum_ok=False), Preflight(), MB4, 2)
    assert "every rank" in everywhere.message and everywhere.suspects == ("n1", "n2")


def test_slow_node_of_three_is_the_one_on_both_slow_links() -> None:
    # Ranks 0-1 n1, 2-3 n2, 4-5 n3: rank 4 receives n2->n3, rank 2 receives n1->n2; both go
    # through n2, whose link is slow. n3->n1 (rank 0) is fast.
    hosts = ["n1", "n1", "n2", "n2", "n3", "n3"]
    slow = reports(hosts, ring_s={2: 0.4, 4: 0.4}, allreduce_s=0.4)
    verdict = preflight.verdict(slow, Preflight(min_bus_gbps=5), MB4, 3)
    assert not verdict.ok and verdict.suspects == ("n2",)
    assert verdict.message.startswith("n2: all-reduce bus bandwidth") and "min_bus_gbps=5" in verdict.message
    assert "resources.exclude=HOST" in verdict.message


def test_with_two_nodes_both_ends_of_the_slow_link_are_named() -> None:
    slow = reports(["n1", "n2"], ring_s={0: 0.4, 1: 0.4}, allreduce_s=0.4)
    verdict = preflight.verdict(slow, Preflight(min_bus_gbps=5), MB4, 2)
    assert not verdict.ok and verdict.suspects == ("n1", "n2")


def test_threshold_zero_never_fails_and_a_fast_job_passes_a_floor() -> None:
    slow = reports(["n1", "n2"], allreduce_s=10.0)
    assert preflight.verdict(slow, Preflight(min_bus_gbps=0), MB4, 2).ok
    assert preflight.verdict(reports(["n1", "n2"]), Preflight(min_bus_gbps=1), MB4, 2).ok


def test_slow_hosts_without_a_link_below_the_floor_blames_the_slowest() -> None:
    links = [Link("a", "b", 9.0), Link("b", "c", 3.0), Link("c", "a", 8.0)]
    assert preflight.slow_hosts(links, 2.0) == ["b", "c"]
    assert preflight.slow_hosts([], 2.0) == []


def test_device_problems_name_the_host() -> None:
    assert preflight.device_problem(0, 1, "gpu7", 3) is None
    none = preflight.device_problem(0, 0, "gpu7", 3)
    assert none is not None and none.startswith("gpu7: rank 3") and "resources.exclude=gpu7" in none
    missing = preflight.device_problem(2, 2, "gpu7", 3)
    assert missing is not None and "cuda:2" in missing and "2 device(s)" in missing


def test_config_section_defaults_and_errors(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: train.py:main\n")
    loaded = load_experiment(exp)
    assert loaded.experiment.preflight == Preflight()
    assert loaded.resolved["preflight"] == {
        "enabled": True,
        "size_mb": 4,
        "min_bus_gbps": 0,
        "fail_on_host": None,
    }
    with pytest.raises(ConfigError, match=r"override 'preflight.size_mb=0': must be > 0"):
        load_experiment(exp, ["preflight.size_mb=0"])
    with pytest.raises(ConfigError, match=r"override 'preflight.min_bus_gbps=-1': must be >= 0"):
        load_experiment(exp, ["preflight.min_bus_gbps=-1"])


def test_a_preflight_failure_is_not_requeued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.yaml").write_text("requeue:\n  max_failures: 3\n")
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}
    Failure(None, 0, "preflight failed: n2", AttemptId("7", 0), 1.0, retry=False).write(tmp_path)
    settings = outcome.Settings.of_run(tmp_path)
    decision = requeue.decide(tmp_path, 1, env, settings, preempt_time=lambda job: None)
    assert not decision.requeue and decision.message == "preflight failed: n2: not retrying"


def submit_local(cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(ROOT / "examples" / "synthetic.yaml"),
            "executor=local",
            "resources.nodes=1",
            "train.steps=3",
            f"output_dir={cwd / 'runs'}",
            *overrides,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_local_ranks_pass_the_preflight_quickly(tmp_path: Path) -> None:
    proc = submit_local(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = (tmp_path / "runs").glob("synthetic/*/preflight.json")
    record = json.loads(found.read_text())
    assert record["ok"] and record["bytes"] == MB4 and len(record["ranks"]) == 2
    assert all(r["sum_ok"] for r in record["ranks"])
    # The whole check, 4 all-reduces of 4 MB, a ring transfer and the gather, on 2 CPU ranks.
    assert record["seconds"] < 0.5, record


def test_local_forced_failure_names_the_host_and_stops(tmp_path: Path) -> None:
    host = socket.gethostname()
    proc = submit_local(tmp_path, f"preflight.fail_on_host={host}", "dist.timeout_s=60")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"preflight failed: {host}: failed on purpose" in proc.stdout
    assert not list((tmp_path / "runs").glob("synthetic/*/result.json"))
