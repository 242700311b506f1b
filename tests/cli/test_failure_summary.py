"""A real local run of a train function with a typo (`cfg.lrr`): `submit` ends with the error,
the user's line, the rank and its log; `status` and `status --json` say the same."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import only_run
from conftest import slurmddp as run_slurmddp

TRAIN = """\
import torch


def train(ctx):
    cfg = ctx.config.train
    return {"lr": helper(cfg)}


def helper(cfg):
    return cfg.lrr
"""
"""The typo is on line 10, in helper(), called from train()."""
EXPERIMENT = "entrypoint: train.py:train\nresources: {nodes: 1, tasks_per_node: 2}\ntrain: {lr: 0.1}\n"


def slurmddp(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_slurmddp(dict(os.environ), cwd, *args)


def summary(stdout: str) -> list[str]:
    """The three lines after `ended FAILED`: the block of paths and next commands follows them."""
    lines = stdout.splitlines()
    ended = next(i for i, line in enumerate(lines) if " ended FAILED " in line)
    return lines[ended + 1 : ended + 4]


def test_a_typo_in_train_py_ends_with_its_line_and_status_says_so(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    proc = slurmddp(tmp_path, "submit", "exp.yaml", "executor=local", "output_dir=runs")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = only_run(tmp_path / "runs")
    job = json.loads((run / "manifest.json").read_text())["job_id"]
    failure = json.loads((run / "failure.json").read_text())
    rank = failure["rank"]
    log = run / "logs" / f"{job}_{rank}_log.err"
    # The traceback is in the log, not on the screen: only its exception line is relayed.
    assert "Traceback" not in proc.stdout and 'File "' not in proc.stdout
    assert summary(proc.stdout) == [
        "slurmddp: ConfigAttributeError: Missing key lrr. Did you mean: 'lr'?",
        f"  at train.py:10 in helper (rank {rank}, the first of 2 ranks to fail)",
        f"  full traceback: {log}",
    ]
    assert "Missing key lrr" in log.read_text()

    table = slurmddp(tmp_path, "status", str(run))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[-1] == (
        f"run: job {job} failed on rank {rank}: ConfigAttributeError: Missing key lrr. Did you mean: 'lr'? "
        f"at train.py:10 in helper; log {log}"
    )
    given = slurmddp(tmp_path, "status", str(run), "--json")
    (element,) = json.loads(given.stdout)["elements"]
    assert element["state"] == "FAILED"
    assert element["failures"] == [
        {
            "job_id": job,
            "restart_count": 0,
            "rank": rank,
            "type": "ConfigAttributeError",
            "message": "Missing key lrr. Did you mean: 'lr'?",
            "where": {"file": str(tmp_path / "train.py"), "line": 10, "function": "helper"},
            "log": str(log),
        }
    ]


def test_an_error_while_the_module_is_imported_is_explained_too(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\n\nSIZE = siez\n\n\ndef train(ctx):\n    return {}\n")
    (tmp_path / "exp.yaml").write_text(EXPERIMENT.replace("tasks_per_node: 2", "tasks_per_node: 1"))
    proc = slurmddp(tmp_path, "submit", "exp.yaml", "executor=local", "output_dir=runs")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said, at, _ = summary(proc.stdout)
    assert said.startswith("slurmddp: NameError: name 'siez' is not defined"), proc.stdout
    assert at == "  at train.py:3 in <module> (rank 0)"
