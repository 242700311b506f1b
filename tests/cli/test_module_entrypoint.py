"""`entrypoint.module` on the no-cluster path: every local gloo rank runs `python -m PACKAGE ARGS`
from the submit directory, as torchrun -m would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torchrun_module import PACKAGE, write_package


def test_module_entrypoint_runs_on_three_local_ranks(tmp_path: Path) -> None:
    write_package(tmp_path)
    exp = tmp_path / "mod.yaml"
    exp.write_text(
        f"entrypoint:\n  module: {PACKAGE}\n  args: [--tag, 'a b $HOME', --n, '7']\n"
        "resources:\n  tasks_per_node: 3\ndist:\n  timeout_s: 60\n"
    )
    out = f"output_dir={tmp_path / 'runs'}"
    proc = subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", str(exp), "executor=local", out],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = (tmp_path / "runs").glob("mod/*/")
    ranks = [json.loads((run / f"rank_{rank}.json").read_text()) for rank in range(3)]
    for rank, seen in enumerate(ranks):
        assert (seen["rank"], seen["world_size"], seen["sum"]) == (rank, 3, 3.0)
        assert (seen["tag"], seen["n"]) == ("a b $HOME", 7), "the arguments did not arrive intact"
        # Run as `python -m ddpmod`: __main__ of its package, the submit directory first on sys.path.
        assert (seen["name"], seen["package"]) == ("__main__", PACKAGE)
        assert seen["cwd"] == seen["path0"] == str(tmp_path)
        assert seen["env"]["RANK"] == str(rank) and seen["env"]["WORLD_SIZE"] == "3"
