"""transformers' Trainer internals used by slurmddp's TrainerCallback (integrations/transformers.py),
and nowhere else. A callback sees only `args`, `state` and `control`; what it needs beyond them has
no public API, and each accessor's docstring says which versions it was checked on and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TESTED_VERSIONS = ("5.24.0",)
"""The transformers versions every accessor below was checked on."""
INTERNALS = (
    "Trainer._run_epoch",
    "Trainer._save_checkpoint",
    "trainer.callback_handler.callbacks",
    "trainer.callback_handler.on_save",
)
"""Every internal name reached below, from the Trainer class (`Trainer`) and a built one
(`trainer`); `callback_handler` is not underscored, but Trainer documents only `add_callback`,
`pop_callback` and `remove_callback` around it."""
_RUN_EPOCH = "_run_epoch"


def replace_epoch(trainer: Any, epoch: Callable[..., None]) -> None:
    """Make `trainer` run `epoch` (called with keyword arguments only) instead of its own epoch, on
    this instance, until `restore_epoch` (checked on transformers 5.24.0). Private:
    `Trainer._run_epoch`; a train() resumed where training had ended must not start the next step,
    and Trainer checks only after it."""
    setattr(trainer, _RUN_EPOCH, epoch)


def restore_epoch(trainer: Any) -> None:
    """Undo `replace_epoch` on `trainer` (nothing to undo: nothing happens)."""
    trainer.__dict__.pop(_RUN_EPOCH, None)


def save_checkpoint(trainer: Any) -> None:
    """Save `trainer`'s checkpoint at its current step, as its own save does, and tell its callbacks
    (`on_save`), as its own save does (checked on transformers 5.24.0). Private:
    `Trainer._save_checkpoint(model, trial)`; `save_model` saves no optimizer, scheduler or RNG
    state, and a save Trainer dropped (save_strategy="best") must still be made before the next
    batch is drawn."""
    trainer._save_checkpoint(trainer.model_wrapped, trial=None)
    trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)


def callbacks(trainer: Any) -> list[Any]:
    """The callbacks `trainer` calls, in the order it calls them: the list itself, so reordering it
    reorders them (checked on transformers 5.24.0). Internal: `Trainer.callback_handler.callbacks`;
    `add_callback`/`remove_callback` append only, and the stop must come after every other
    callback's `on_save`."""
    found: list[Any] = trainer.callback_handler.callbacks
    return found
