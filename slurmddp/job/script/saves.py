"""The checkpoints a script saves itself with torch.distributed.checkpoint, as torchtitan and the
DCP tutorials teach: rank 0 records each one once its save has returned (RUN_DIR/
script_checkpoints.jsonl), at the step the run is at, so that `status` can say what was saved and
where a resubmit goes on from. slurmddp loads none of them: the script resumes from its own, and
its load of one so recorded says which step the attempt resumed from (the steps after it, made
again, are then not counted twice).

Installed in every script's process (job/script/scriptrun.py); until the script imports
torch.distributed.checkpoint it is an import hook and nothing else.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from slurmddp.job.script import autoload
from slurmddp.rundir.script_saves import ScriptSave, append_save, read_saves

DCP = "torch.distributed.checkpoint"


def install(step_of: Callable[[], int], anchor: Callable[[int], None]) -> None:
    """On rank 0, once the script loads DCP: its `save` and `async_save` record what they saved,
    at the step `step_of` says the run is at, and its `load` of a checkpoint so recorded tells
    `anchor` the step this attempt resumes from."""
    run_dir = os.environ.get("SLURMDDP_RUN_DIR")
    if os.environ.get("RANK", "0") == "0" and run_dir:
        autoload.on_load({DCP: functools.partial(_wrap, Path(run_dir), step_of, anchor)})


def _wrap(run_dir: Path, step_of: Callable[[], int], anchor: Callable[[int], None], dcp: ModuleType) -> None:
    def record(where: str) -> None:
        append_save(run_dir, ScriptSave(step_of(), round(time.time(), 3), where))

    def resumed(where: str) -> None:
        step = next((save.step for save in reversed(read_saves(run_dir)) if save.path == where), None)
        if step is not None:
            anchor(step)

    for name in ("save", "async_save", "load"):
        original = getattr(dcp, name, None)
        if original is not None:
            then = resumed if name == "load" else record
            setattr(dcp, name, _recording(original, then, asynchronous=name == "async_save"))


def _recording(call: Any, record: Callable[[str], None], asynchronous: bool) -> Any:
    """`call` (DCP's save, async_save or load), then `record` of the directory it went to, once
    it is done."""

    @functools.wraps(call)
    def recording(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        where = _directory(kwargs)
        if where is None:
            return result
        if not asynchronous:
            record(where)
            return result

        def saved(future: Any) -> None:
            if future.exception() is None:
                record(where)

        # async_save returns a Future, or in newer releases a response whose upload completes last.
        done = getattr(result, "upload_completion", result)
        if hasattr(done, "add_done_callback"):
            done.add_done_callback(saved)
        return result

    return recording


def _directory(kwargs: dict[str, Any]) -> str | None:
    """Where the save went (or the load came from): its checkpoint_id, or its storage writer's
    (reader's) path."""
    where = kwargs.get("checkpoint_id")
    if where is None:
        where = getattr(kwargs.get("storage_writer", kwargs.get("storage_reader")), "path", None)
    return None if where is None else os.path.abspath(os.fspath(where))
