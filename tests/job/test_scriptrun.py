"""job.scriptrun: a torchrun-style script runs as `python script.py` would, its optimizer steps are
counted, and a rank of it that hangs is caught by the watchdog with the script's own stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DIE_IN_SHUTDOWN, only_run, slurmddp

from slurmddp.job.script.scriptrun import (
    STEP_FILE_ENV,
    STEPS_BEFORE_ENV,
    anchor,
    expect_total,
    read_finished,
    read_resumed,
    read_steps,
    read_total,
    run_step,
)

# Five optimizer steps, one skipped by a GradScaler that found an inf (no step is made then), and
# what `python script.py` / `python -m` would show it.
STEPPING = """
import json, sys
import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", enabled=True)
for step in range(6):
    optimizer.zero_grad()
    loss = model(torch.ones(1, 2)).sum() * (float("inf") if step == 2 else 1.0)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0]}))
"""

# Rank 1 stops making progress at its fourth step (outside any collective); the others wait for
# it in DDP's all-reduce.
HANGING = """
import time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    while step == 3 and dist.get_rank() == 1:
        time.sleep(0.1)  # the blocking line
    optimizer.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()
"""


# Ends as it is told, after an exit handler of its own that shows whether the finished mark was
# already there; "abort" ends with status 0 and would then die of SIGABRT while Python shuts down, as
# a C++ thread taking the GIL then makes it die.
ENDING = (
    """
import atexit, os, signal, sys, types
from pathlib import Path
from slurmddp.job.script.scriptrun import read_finished
"""
    + DIE_IN_SHUTDOWN
    + """
mark = Path(sys.argv[2])
atexit.register(lambda: print("mark before the script's handler:", read_finished(mark), flush=True))
how = sys.argv[1]
if how == "abort":
    die_in_shutdown()
elif how == "exit 3":
    sys.exit(3)
elif how == "raise":
    raise RuntimeError("the script failed")
elif how == "fork, then raise":
    child = os.fork()
    if child == 0:
        sys.exit(0)
    os.waitpid(child, 0)
    raise RuntimeError("the script failed after its child ended with status 0")
"""
)


def wrap(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    steps = tmp_path / "steps"
    steps.write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "slurmddp.job.script.scriptrun", *args],
        cwd=tmp_path,
        env={**os.environ, STEP_FILE_ENV: str(steps)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, steps


def run_wrapped(tmp_path: Path, *args: str) -> tuple[dict[str, object], int | None]:
    proc, steps = wrap(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), read_steps(steps)


def test_a_script_runs_as_python_runs_it_and_its_optimizer_steps_are_counted(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text(STEPPING)
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "__main__.py").write_text(STEPPING)

    shown, steps = run_wrapped(tmp_path, str(code / "train.py"), "--lr", "a b")
    assert shown == {"name": "__main__", "argv": [str(code / "train.py"), "--lr", "a b"], "path0": str(code)}
    assert steps == 5

    # -m runs from the working directory, first on sys.path, as `python -m` does.
    shown, steps = run_wrapped(code, "-m", "pkg", "--n", "7")
    assert shown["name"] == "__main__" and shown["argv"] == [str(code / "pkg" / "__main__.py"), "--n", "7"]
    assert shown["path0"] == str(code) and steps == 5


def test_the_finished_mark_comes_after_the_scripts_exit_handlers_and_only_for_status_0(
    tmp_path: Path,
) -> None:
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    steps = str(tmp_path / "steps")
    ends = [
        ("return", 0, True),
        # Before: status -6 (SIGABRT), the abort in the log, and the rank counting it as completed.
        ("abort", 0, True),
        ("exit 3", 3, False),
        ("raise", 1, False),
        ("fork, then raise", 1, False),
    ]
    for how, status, finished in ends:
        proc, path = wrap(tmp_path, str(script), how, steps)
        assert (proc.returncode, read_finished(path)) == (status, finished), (how, proc.stderr)
        assert "mark before the script's handler: False" in proc.stdout, (how, proc.stdout)
        # No optimizer step was made: the mark alone is no step count.
        assert read_steps(path) is None
        if finished:
            assert proc.stderr == "", (how, proc.stderr)


def test_no_step_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert read_steps(tmp_path / "empty") is None
    assert read_steps(tmp_path / "missing") is None


def test_a_script_rank_that_hangs_is_named_with_its_blocking_line(tmp_path: Path) -> None:
    (tmp_path / "hanging.py").write_text(HANGING)
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: hanging.py\nresources: {tasks_per_node: 3}\ndist: {hang_timeout_s: 10}\n")
    started = time.monotonic()
    proc = slurmddp(
        dict(os.environ), tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}"
    )
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    run = only_run(tmp_path / "runs")
    (hang,) = (run / "hangs").iterdir()
    summary = json.loads((hang / "summary.json").read_text())
    line = next(n for n, text in enumerate(HANGING.splitlines(), 1) if "the blocking line" in text)
    assert "hung at step 3: rank 1 on" in summary["cause"], summary
    assert f"hanging.py:{line} in <module>) did not arrive" in summary["cause"], summary
    assert f'hanging.py", line {line}' in (hang / "rank_1.stacks.txt").read_text()
    failure = json.loads((run / "failure.json").read_text())
    assert failure["error"].startswith("hang: hung at step 3"), failure
    print(f"the hang was caught and the run ended {took:.0f} s after submitting")


# A DDP script that ends with status 0 on every rank; rank 1's process would then die of SIGABRT
# while Python shuts down, as a torch C++ thread taking the GIL then makes it die.
DDP_DIES_IN_SHUTDOWN = (
    """
import atexit, os, signal, sys, types
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
"""
    + DIE_IN_SHUTDOWN
    + """
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()
rank = dist.get_rank()
atexit.register(lambda: print(f"rank {rank}: the script's exit handler ran", flush=True))
if rank == 1:
    die_in_shutdown()
dist.destroy_process_group()
"""
)


def test_a_finished_script_rank_leaves_before_the_teardown_that_would_abort_it(tmp_path: Path) -> None:
    """Before: rank 1's log ended with the abort and `... died of SIGABRT while Python shut down;
    counted as completed`."""
    (tmp_path / "dies.py").write_text(DDP_DIES_IN_SHUTDOWN)
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: dies.py\nresources: {tasks_per_node: 2}\n")
    proc = slurmddp(
        dict(os.environ), tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended COMPLETED" in proc.stdout
    run = only_run(tmp_path / "runs")
    errs = {path.name: path.read_text() for path in (run / "logs").glob("*_log.err")}
    outs = "".join(path.read_text() for path in (run / "logs").glob("*_log.out"))
    assert len(errs) == 2
    for name, text in errs.items():
        assert "SIGABRT" not in text and "terminate called" not in text, (name, text)
        assert "counted as completed" not in text, (name, text)
    assert all(f"rank {rank}: the script's exit handler ran" in outs for rank in (0, 1)), outs


def test_a_resume_step_is_kept_once_and_a_reported_one_only_up_to_the_steps_made_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = tmp_path / "steps"
    monkeypatch.setenv(STEP_FILE_ENV, str(steps))
    monkeypatch.setenv(STEPS_BEFORE_ENV, "26")
    steps.write_bytes(b"")
    anchor(30)  # a report past the 26 steps made: samples or epochs, not steps
    assert read_resumed(steps) is None
    anchor(5)  # at count 0
    anchor(20)  # the first one stands
    assert read_resumed(steps) == 5
    # A checkpoint slurmddp recorded at step 30 counts though the killed attempt's last poll said 26.
    steps.write_bytes((3).to_bytes(8, "little"))
    anchor(33)
    assert read_resumed(steps) is None
    anchor(33, recorded=True)
    assert read_resumed(steps) == 30 and run_step(steps, 26) == (30, 33)


def test_the_runs_total_is_kept_beside_the_count_and_the_latest_said_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = tmp_path / "steps"
    steps.write_bytes((7).to_bytes(8, "little"))
    assert read_total(steps) is None
    expect_total(120)  # outside a script's process: nothing
    assert read_total(steps) is None
    monkeypatch.setenv(STEP_FILE_ENV, str(steps))
    expect_total(120)
    expect_total(0)  # Lightning's or HF's "no bound": the total said stands
    expect_total(150)
    assert read_total(steps) == 150 and read_steps(steps) == 7 and read_resumed(steps) is None
