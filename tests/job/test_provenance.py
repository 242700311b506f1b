"""The provenance record of an attempt: the code's commit and dirty diff, the nodes, the packages."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from slurmddp.job.launch import provenance
from slurmddp.rundir.layout import PROVENANCE


def test_provenance_records_the_commit_and_the_dirty_diff(tmp_path: Path) -> None:
    repo = tmp_path / "code"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "train.py").write_text("lr = 1\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "train.py").write_text("lr = 2\n")
    (repo / "new.py").write_text("")
    run = tmp_path / "run"
    path = provenance.record(run, repo, {"SLURM_JOB_NODELIST": "node[1-2]"}, {"train": {}}, "41", 2)
    data = json.loads(path.read_text())
    assert path.name == "41-2.json" and data["restart_count"] == 2
    assert data["git"]["commit"] == commit and data["git"]["dirty"] and data["git"]["untracked"] == ["new.py"]
    assert "+lr = 2" in (run / PROVENANCE / data["git"]["diff_file"]).read_text()
    assert data["nodes"] == ["node1", "node2"] and data["packages"]["omegaconf"]
    # Outside a repository there is no git record, and no diff file.
    outside = json.loads(provenance.record(run, tmp_path / "run", {}, {}, "42", 0).read_text())
    assert outside["git"] is None
