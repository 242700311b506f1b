"""RUN_DIR/config.yaml: the resolved experiment (every key the schema knows, the profile merged in),
written at submit time and replaced by a resubmit. The batch script reads its requeue settings
from it, and a resubmit loads it again as the experiment that was submitted."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slurmddp import yamlio
from slurmddp.files import write_atomic
from slurmddp.rundir.layout import CHECKPOINTS, CONFIG


def read_config(run_dir: Path) -> dict[str, Any]:
    """The resolved experiment as a mapping ({} where the file holds none); the OSError or the
    yaml.YAMLError where it cannot be read."""
    loaded = yamlio.load((run_dir / CONFIG).read_text())
    return loaded if isinstance(loaded, dict) else {}


def checkpoint_dir(run_dir: Path, workdir: str | None) -> Path:
    """Where the run's ranks keep their checkpoints: `checkpoint.dir` (a relative one from the
    run's working directory, where the ranks run), else RUN_DIR/checkpoints."""
    try:
        section = read_config(run_dir).get("checkpoint")
    except (OSError, yaml.YAMLError):
        section = None
    named = section.get("dir") if isinstance(section, dict) else None
    if not isinstance(named, str):
        return run_dir / CHECKPOINTS
    return Path(workdir or run_dir) / named


def spare_share(run_dir: Path) -> float:
    """The spare nodes' share of the nodes the run's jobs hold (resources.spare_nodes over
    resources.nodes plus them); 0 where the config cannot say."""
    try:
        section = read_config(run_dir).get("resources")
    except (OSError, yaml.YAMLError):
        return 0.0
    if not isinstance(section, dict):
        return 0.0
    nodes, spares = section.get("nodes"), section.get("spare_nodes")
    if not isinstance(nodes, int) or not isinstance(spares, int) or nodes + spares <= 0:
        return 0.0
    return spares / (nodes + spares)


def write_config(run_dir: Path, resolved: Mapping[str, Any], *, durable: bool = True) -> None:
    """Write the resolved experiment. `durable=False`: a plain write, for the many elements of a
    sweep, whose manifest (written durably after them) is what makes the sweep exist."""
    text = yamlio.dump(dict(resolved))
    if durable:
        write_atomic(run_dir / CONFIG, text)
    else:
        (run_dir / CONFIG).write_text(text)


def replace_config(run_dir: Path, resolved: Mapping[str, Any]) -> str:
    """Write the resolved experiment over the run's; the text it replaced, for `restore_config`."""
    before = (run_dir / CONFIG).read_text()
    write_config(run_dir, resolved)
    return before


def restore_config(run_dir: Path, before: str) -> None:
    """Put back, byte for byte, the config.yaml that `replace_config` replaced."""
    write_atomic(run_dir / CONFIG, before)
