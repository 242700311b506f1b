"""`interrupt` on local runs (no Slurm): the ranks stop at one step and save, submitit's local
executor starts them again as attempt 2, which resumes and completes; `status` and attempts.jsonl
say so. Driven through `python -m slurmddp` as a user on a laptop would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import only_run, slurmddp, wait_until

from slurmddp.errors import EXIT_USER_ERROR
from slurmddp.manage import report, runs

# The first attempt crawls (0.1 s a step), so that the interrupt always lands mid-run on a loaded
# machine; the resumed attempt runs at full speed.
SCRIPT = """
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import slurmddp

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
snapshot = os.path.join(os.environ["SLURMDDP_RUN_DIR"], "snapshot.pt")
start = 0
if os.path.exists(snapshot):
    state = torch.load(snapshot, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
    print(f"resumed from the snapshot at step {start}", flush=True)
for step in range(start, STEPS):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    if start == 0:
        time.sleep(0.1)
    if slurmddp.should_stop():
        if dist.get_rank() == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "step": step + 1}, snapshot + ".tmp")
            os.replace(snapshot + ".tmp", snapshot)
        dist.barrier()
        slurmddp.exit_for_requeue()
dist.destroy_process_group()
"""

FUNCTION = """
import time
import torch

def main(ctx):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in ctx.loop(STEPS, model=model, optimizer=optimizer):
        optimizer.zero_grad()
        ddp(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        if ctx.restart_count == 0:
            time.sleep(0.1)
    return {"restart_count": ctx.restart_count}
"""

EXPERIMENT = """
entrypoint: {entrypoint}
resources:
  tasks_per_node: 2
  time: "00:10:00"
dist:
  timeout_s: 60
"""


def write_experiment(tmp_path: Path, entrypoint: str) -> Path:
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT.format(entrypoint=entrypoint))
    return exp


def interrupted_once(tmp_path: Path, exp: Path, reason: str) -> Path:
    """Submit `exp` locally, `interrupt RUN --REASON` it once its rank 0 recorded progress, and
    wait for the run to end; its run directory. The run must have completed."""
    out = tmp_path / "runs"
    env = dict(os.environ)
    submit = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(exp), "executor=local", f"output_dir={out}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        progress = out / "exp"

        def started() -> bool:
            assert submit.poll() is None, "the run ended before it could be interrupted"
            found = list(progress.glob("*/progress.json"))
            return bool(found) and json.loads(found[0].read_text() or "{}").get("step", 0) >= 3

        wait_until("rank 0 recording its third step", started, timeout=120)
        run = only_run(out)
        proc = slurmddp(env, tmp_path, "interrupt", str(run), f"--{reason}", timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"to the 2 ranks of local job {json.loads((run / 'manifest.json').read_text())['job_id']}" in (
            proc.stdout
        )
        said, _ = submit.communicate(timeout=150)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == 0, said
    return run


def status_of(tmp_path: Path, run: Path) -> dict[str, Any]:
    proc = slurmddp(dict(os.environ), tmp_path, "status", str(run), "--json", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [element] = json.loads(proc.stdout)["elements"]
    assert isinstance(element, dict)
    return element


def check_preempted_then_completed(tmp_path: Path, run: Path, reason: str) -> dict[str, Any]:
    """`status` and attempts.jsonl: two attempts, the first stopped for `reason` and requeued, the
    second completed; the rank banner counted them. `status --json`'s element."""
    element = status_of(tmp_path, run)
    ended = element["ended"]
    assert (element["state"], element["attempts"]) == ("COMPLETED", 2), element
    assert [(e["attempt"], e["reason"], e["requeue"]) for e in ended] == [
        (1, reason, True),
        (2, "completed", False),
    ], element
    records = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    assert [(r["event"], r["restart_count"], r.get("reason")) for r in records] == [
        ("begin", 0, None),
        ("end", 0, reason),
        ("begin", 1, None),
        ("end", 1, "completed"),
    ], records
    assert records[1]["final"] is False and records[3]["final"] is True
    log = "".join(path.read_text() for path in sorted((run / "logs").glob("*_0_log.err")))
    assert "attempt 1\n" in log and "attempt 2\n" in log, log
    target = runs.load(run)
    text = report.status_table(target, runs.rows(target, with_usage=False), None)
    # A script's steps are its own: its stop records none (ctx.loop's records its step).
    stopped = f"{reason} at step {ended[0]['step']}" if ended[0]["step"] is not None else reason
    assert f"run: attempt 1: {stopped}; attempt 2: completed" in text, text
    return element


def test_a_local_script_interrupted_as_a_preemption_resumes_and_completes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.replace("STEPS", "300"))
    run = interrupted_once(tmp_path, write_experiment(tmp_path, "train.py"), "preempt")
    check_preempted_then_completed(tmp_path, run, "preemption")
    log = "".join(path.read_text() for path in sorted((run / "logs").glob("*_0_log.out")))
    assert "resumed from the snapshot at step" in log, log
    # The run has ended: a second interrupt says so, and signals nothing.
    proc = slurmddp(dict(os.environ), tmp_path, "interrupt", str(run), "--preempt", timeout=60)
    assert proc.returncode == EXIT_USER_ERROR, proc.stdout + proc.stderr
    assert "is not running: the run ended (completed)" in proc.stderr, proc.stderr


def test_a_local_function_interrupted_as_a_timeout_resumes_and_completes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FUNCTION.replace("STEPS", "300"))
    run = interrupted_once(tmp_path, write_experiment(tmp_path, "train.py:main"), "timeout")
    element = check_preempted_then_completed(tmp_path, run, "timeout")
    assert isinstance(element["ended"][0]["step"], int)
    result = json.loads((run / "result.json").read_text())
    assert result["result"] == {"restart_count": 1} and result["restart_count"] == 1, result
