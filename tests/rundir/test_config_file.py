"""config.yaml: the resolved experiment, written as the submit path wrote it, and put back byte
for byte when a resubmit is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurmddp import yamlio
from slurmddp.rundir.config import read_config, replace_config, restore_config, write_config

RESOLVED = {"name": "exp", "resources": {"time": "1:30:00", "nodes": 2}, "train": {"lr": 1e-3}}


@pytest.mark.parametrize("durable", [True, False])
def test_the_config_is_yamlio_s_dump_of_the_resolved_experiment(tmp_path: Path, durable: bool) -> None:
    write_config(tmp_path, RESOLVED, durable=durable)
    assert (tmp_path / "config.yaml").read_text() == yamlio.dump(RESOLVED)
    assert read_config(tmp_path) == RESOLVED


def test_a_file_without_a_mapping_reads_as_none_and_a_broken_one_raises(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("")
    assert read_config(tmp_path) == {}
    (tmp_path / "config.yaml").write_text("a: [1\n")
    with pytest.raises(yaml.YAMLError):
        read_config(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_config(tmp_path / "missing")


def test_a_replaced_config_is_put_back_as_it_was(tmp_path: Path) -> None:
    original = "# hand-edited\nname: exp\n"
    (tmp_path / "config.yaml").write_text(original)
    before = replace_config(tmp_path, RESOLVED)
    assert read_config(tmp_path) == RESOLVED
    restore_config(tmp_path, before)
    assert (tmp_path / "config.yaml").read_text() == original
