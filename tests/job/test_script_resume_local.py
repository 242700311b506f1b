"""A torchrun-style script that saves its own checkpoints with torch.distributed.checkpoint every
10 steps and logs with `slurmddp.report` every 5, on 3 local ranks, stopped after step 25 by
the signal Slurm sends near the time limit: it dies of the SIGTERM its rank passes on (it never
asks `should_stop()`), is requeued, loads its newest checkpoint (step 20)
and makes the steps after it again. What slurmddp says of the run counts each step once: the
progress step ends at the script's last, metrics.jsonl holds each logged step once, every save is
recorded at the script's own step, and `status` names the checkpoints and the step a resubmit
goes on from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, only_run

from slurmddp.manage import runs
from slurmddp.rundir.metrics import read_metrics
from slurmddp.rundir.records import Progress
from slurmddp.rundir.script_saves import read_saves

pytestmark = pytest.mark.process

STEPS = 40
SCRIPT = """
import os, signal, sys, time
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel
import slurmddp

root = os.path.join(os.environ["SLURMDDP_RUN_DIR"], "ckpt")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
slurmddp.total_steps(int(sys.argv[1]))
step = 0
names = os.listdir(root) if os.path.isdir(root) else []
done = sorted(int(n) for n in names if os.path.exists(os.path.join(root, n, ".metadata")))
if done:
    state = {"model": model.module.state_dict(), "step": torch.zeros((), dtype=torch.int64)}
    dcp.load(state, checkpoint_id=os.path.join(root, str(done[-1])))
    model.module.load_state_dict(state["model"])
    step = int(state["step"])
    print(f"resumed from its checkpoint at step {step}", flush=True)
while step < int(sys.argv[1]):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    step += 1
    if step % 5 == 0:
        slurmddp.report(step, loss=float(step))
    if step == 25 and not done and os.environ["RANK"] == "0":
        # What Slurm does near the time limit: USR2 to the rank, which passes it on as SIGTERM.
        os.kill(os.getppid(), signal.SIGUSR2)
        time.sleep(60)
    if step % 10 == 0:
        state = {"model": model.module.state_dict(), "step": torch.tensor(step)}
        dcp.save(state, checkpoint_id=os.path.join(root, str(step)))
dist.destroy_process_group()
"""


def test_a_script_resumed_from_its_own_older_checkpoint_is_reported_with_each_step_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "dcp_train.py").write_text(SCRIPT)
    (tmp_path / "exp.yaml").write_text(
        f"entrypoint: dcp_train.py {STEPS}\nexecutor: local\n"
        "resources: {nodes: 1, tasks_per_node: 3, time: '00:10:00'}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", "exp.yaml", f"output_dir={tmp_path / 'runs'}", "--wait"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    run = only_run(tmp_path / "runs")
    log = "".join(p.read_text() for p in sorted((run / "logs").glob("*_0_log.out")))
    assert "resumed from its checkpoint at step 20" in log, log

    progress = Progress.read(run)
    assert progress is not None and (progress.step, progress.started_step) == (STEPS, 20), progress
    # slurmddp.total_steps: the share done and an ETA, as a ctx.loop run has them.
    assert progress.loop is not None and progress.loop.total_steps == STEPS, progress
    assert f"step {STEPS}/{STEPS} (100%)" in out, out
    logged = [r.step for r in read_metrics(run)]
    assert logged == list(range(5, STEPS + 1, 5)), logged
    saves = read_saves(run)
    assert [(s.step, Path(s.path).name) for s in saves] == [(n, str(n)) for n in range(10, STEPS + 1, 10)]
    row = runs.rows(runs.load(run), with_usage=False)[0]
    assert (row.step, row.resume.step, row.resume.saves) == (STEPS, STEPS, 4), row
    assert [end.reason for end in row.ended] == ["timeout", "completed"], row.ended
    said = "checkpoints: 4 saved by the script with torch.distributed.checkpoint (newest: step"
    assert f"{said} {STEPS}, {run / 'ckpt' / str(STEPS)})" in out, out
