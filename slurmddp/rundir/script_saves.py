"""RUN_DIR/script_checkpoints.jsonl: the checkpoints a script saved itself with
torch.distributed.checkpoint, as rank 0 saw each save return (job/script/saves.py), oldest first.

slurmddp does not load them (the script does, as it resumes); `status`, `submit --wait` and
`cancel` say the newest one that is still there, and the step a resubmit goes on from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmddp.rundir.layout import SCRIPT_SAVES


@dataclass(frozen=True)
class ScriptSave:
    step: int
    """The run's step when the save returned (job/script/scriptrun.run_step)."""
    time: float
    path: str
    """The checkpoint's directory, as the script named it (its `checkpoint_id`), made absolute."""


def append_save(run_dir: Path, save: ScriptSave) -> None:
    with (run_dir / SCRIPT_SAVES).open("a") as handle:
        handle.write(json.dumps(asdict(save)) + "\n")


def read_saves(run_dir: Path) -> list[ScriptSave]:
    """Every save, oldest first; a line cut short by a killed rank 0 is skipped."""
    try:
        lines = (run_dir / SCRIPT_SAVES).read_text().splitlines()
    except OSError:
        return []
    saves = []
    for line in lines:
        try:
            saves.append(ScriptSave(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return saves


def newest_kept(saves: list[ScriptSave]) -> ScriptSave | None:
    """The newest save whose directory is still there (a script may keep only its last few)."""
    return next((save for save in reversed(saves) if Path(save.path).is_dir()), None)
