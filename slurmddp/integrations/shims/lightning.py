"""Lightning's private internals used by slurmddp's Lightning callback (integrations/lightning.py),
and nowhere else. Lightning offers no public hook for what each accessor does; its docstring says
which versions it was checked on and why. Lightning itself is not imported: the objects come from
the running Trainer, so `lightning.pytorch` and `pytorch_lightning` are served alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TESTED_VERSIONS = ("2.6.6",)
"""The Lightning versions every accessor below was checked on."""
INTERNALS = (
    "trainer._signal_connector.register_signal_handlers",
    "trainer._checkpoint_connector.resume_start",
    "trainer.fit_loop._data_fetcher",
    "trainer.fit_loop._combined_loader",
    "trainer.fit_loop.restarted_mid_epoch",
    "trainer.fit_loop.reset_restart_stage",
    "trainer.fit_loop.epoch_loop.batch_progress.is_last_batch",
    "logger._version",
    "logger._experiment",
)
"""Every private name reached below, from a Trainer (`trainer`) and one of its TensorBoard or CSV
loggers (`logger`); the loops are private classes (`_FitLoop`) whatever their attributes' names."""


def after_signal_registration(trainer: Any, after: Callable[[], None]) -> None:
    """Run `after` each time right after Lightning registers its signal handlers (checked on
    Lightning 2.6.6). Private: `Trainer._signal_connector.register_signal_handlers`; Lightning
    registers them between the setup hook and the training, and no public hook runs in between.
    A Lightning without it, or one already wrapped: nothing is wrapped."""
    connector = getattr(trainer, "_signal_connector", None)
    register = getattr(connector, "register_signal_handlers", None)
    if connector is None or register is None or getattr(register, "_slurmddp", False):
        return

    def register_then_after() -> None:
        register()
        after()

    register_then_after._slurmddp = True  # type: ignore[attr-defined]
    connector.register_signal_handlers = register_then_after


def choose_restored_checkpoint(trainer: Any, choose: Callable[[Any], Any]) -> None:
    """Pass the checkpoint path Lightning resolved for `fit(ckpt_path=...)` through `choose`, and
    restore what it returns (checked on Lightning 2.6.6). Private:
    `Trainer._checkpoint_connector.resume_start(checkpoint_path, weights_only)`; no public hook runs
    between resolving `ckpt_path` and restoring it. Without it, RuntimeError."""
    connector = getattr(trainer, "_checkpoint_connector", None)
    resume_start = getattr(connector, "resume_start", None)
    if connector is None or resume_start is None:
        raise RuntimeError(
            "slurmddp's Lightning callback cannot choose the checkpoint to resume from in this "
            "Lightning version (no Trainer._checkpoint_connector.resume_start); tested with "
            + ", ".join(TESTED_VERSIONS)
        )
    original = getattr(resume_start, "_slurmddp_original", resume_start)

    def choosing(checkpoint_path: Any = None, weights_only: Any = None) -> None:
        original(choose(checkpoint_path), weights_only)

    choosing._slurmddp_original = original  # type: ignore[attr-defined]
    connector.resume_start = choosing


def data_fetcher(trainer: Any) -> Any | None:
    """The fit loop's data fetcher, whose `iter()` makes the training DataLoaders' iterators (checked
    on Lightning 2.6.6), or None. Private: `_FitLoop._data_fetcher`; a resume must make them at a
    chosen moment relative to restoring the RNG streams, and Lightning makes them on its own."""
    return getattr(trainer.fit_loop, "_data_fetcher", None)


def combined_loaders(trainer: Any) -> list[Any]:
    """The training loaders the fit loop iterates, flattened (checked on Lightning 2.6.6). Private:
    `_FitLoop._combined_loader`; `trainer.train_dataloader` gives them wrapped in Lightning's
    CombinedLoader only, and a resume repositions the DataLoaders it holds."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    return list(getattr(combined, "flattened", None) or [])


def count_the_next_epoch(loop: Any) -> None:
    """Resumed from the last batch of an epoch, Lightning 2.6.6 ends that epoch in
    `fit_loop.reset()`, but still "restarted mid-epoch" it starts the next one without counting it
    ready and started (and without `on_train_epoch_start`). A checkpoint saved in that epoch then
    holds one epoch too few, and its resume gives the samplers the epoch before (the data order of
    a run stopped at two epoch ends in a row was not the uninterrupted run's). Cleared, the next
    epoch starts as in a run that never stopped. Private (checked on Lightning 2.6.6): the fit loop's
    restart stage (`restarted_mid_epoch`, `reset_restart_stage()`) and its epoch loop's
    `batch_progress`; the loops are no public API."""
    batches = getattr(getattr(loop, "epoch_loop", None), "batch_progress", None)
    if getattr(loop, "restarted_mid_epoch", False) and getattr(batches, "is_last_batch", False):
        loop.reset_restart_stage()


def has_version(logger: Any) -> bool:
    """Whether `logger` keeps a `version_N` (TensorBoard's and CSV's; checked on Lightning 2.6.6).
    Private: `_version`; no public attribute tells a logger that numbers its directories."""
    return hasattr(logger, "_version")


def repoint(logger: Any, version: Any) -> None:
    """Point `logger` at `version`, closing the writer it opened for another (checked on Lightning
    2.6.6). Private: `_experiment` and `_version`; a logger has no public setter of its version, and
    Lightning opened its writer in a new version's directory before any callback's setup ran."""
    close = getattr(getattr(logger, "_experiment", None), "close", None)
    if callable(close):
        close()
    logger._experiment = None
    logger._version = version
