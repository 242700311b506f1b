"""The suite never touches the user's own state: a submission made by a test is indexed in the
test's own XDG_STATE_HOME, and the user's runs.jsonl stays byte for byte as it was (conftest also
fails the whole session when it changed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import USER_INDEX, USER_STATE_VARS, file_digest, slurmddp
from train_sources import write_main


def test_each_test_has_its_own_user_state_directories(own_user_state: dict[str, str], tmp_path: Path) -> None:
    assert set(own_user_state) == set(USER_STATE_VARS)
    for name, value in own_user_state.items():
        assert os.environ[name] == value
        assert not Path(USER_INDEX).is_relative_to(value), (name, value)


def test_a_submission_is_indexed_in_the_tests_own_state_never_the_users(
    own_user_state: dict[str, str], tmp_path: Path
) -> None:
    user_index_before = file_digest(USER_INDEX)
    write_main(tmp_path, returns="{'done': 1}")
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: train.py:main\nresources: {tasks_per_node: 1}\n")
    # The environment every test's subprocesses inherit, as the other tests use it.
    proc = slurmddp(
        dict(os.environ), tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path}/runs"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = Path(own_user_state["XDG_STATE_HOME"]) / "slurmddp" / "runs.jsonl"
    (record,) = [json.loads(line) for line in ours.read_text().splitlines()]
    assert Path(record["dir"]).is_relative_to(tmp_path / "runs")
    assert file_digest(USER_INDEX) == user_index_before
