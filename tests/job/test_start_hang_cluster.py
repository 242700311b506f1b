"""A start that hangs ends at dist.start_timeout_s, not at the time limit, with the rank that holds it
up and its phase named, on the real lab cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import only_run, slurmddp

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]

START_TIMEOUT_S = 20

# Rank 1 never finishes its setup (a dataset download that never ends), on line 8; rank 0 waits for
# it in DDP's first broadcast.
SETUP_HANG = """
import time
import torch
from slurmddp import RunContext

def train(ctx: RunContext) -> dict:
    if ctx.rank == 1:
        time.sleep(10**6)
    model = ctx.ddp(torch.nn.Linear(8, 1))
    for _ in ctx.loop(3):
        model(torch.ones(2, 8)).sum().backward()
    return {}
"""


def test_a_rank_hanging_in_its_setup_ends_the_attempt_at_the_start_up_deadline(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "setup_hang.py").write_text(SETUP_HANG)
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "entrypoint: setup_hang.py:train\n"
        "resources: {nodes: 2, tasks_per_node: 1, time: '00:10:00'}\n"
        f"dist: {{start_timeout_s: {START_TIMEOUT_S}}}\n"
        "requeue: {in_job_restarts: 0, max_failures: 0}\n"
    )
    out = tmp_path / "runs"
    started = time.monotonic()
    proc = slurmddp(slurm_env, tmp_path, "submit", str(exp), f"output_dir={out}", "--wait", timeout=300)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    run = only_run(out)
    records = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    (begin,) = [r for r in records if r["event"] == "begin"]
    (end,) = [r for r in records if r["event"] == "end"]
    assert (end["reason"], end["requeue"]) == ("failure", False), end
    failure = json.loads((run / "failure.json").read_text())
    # An idle lab gives the lowest-numbered nodes first: rank 1 runs on node2.
    assert failure["cause"].startswith(
        "start-up hang: rank 1 on node2 hung in its setup before the first step (in "
    ), failure
    assert "setup_hang.py:8 in train" in failure["cause"] and failure["step"] is None
    assert list(failure["suspect_hosts"]) == ["node2"] and "bad_hosts" not in failure
    assert "start-up hang: rank 1 on node2" in end["message"]
    folder = Path(failure["hang_dir"])
    assert json.loads((folder / "summary.json").read_text())["phase"] == "setup"
    rank_0 = json.loads((folder / "rank_0.json").read_text())
    assert (rank_0["phase"], rank_0["waiting"]) == ("setup", True)  # in DDP's broadcast, for rank 1
    assert 'setup_hang.py", line 8 in train' in (folder / "rank_1.stacks.txt").read_text()
    # From the batch script's start: the ranks' own start (Python, submitit, torch), the deadline,
    # then the reports gathered and srun's end: 46 s once in CI (four labs on two cores), far
    # below the 10 min time limit.
    ended = end["time"] - begin["time"]
    assert ended < START_TIMEOUT_S + 100, ended
    print(f"the start-up hang ended the attempt {ended:.0f} s after it began; {took:.0f} s in all")
