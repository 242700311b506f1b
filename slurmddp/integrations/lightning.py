"""Preemption-safe training under PyTorch Lightning's Trainer, in its own idiom: one callback.

    from slurmddp.integrations.lightning import SlurmddpCallback
    trainer = Trainer(..., strategy="ddp", callbacks=[SlurmddpCallback()])
    trainer.fit(model, ckpt_path="last")          # or no ckpt_path: both resume

or, without touching the Trainer line, `slurmddp.integrations.lightning.auto()` once lightning is
imported: every Trainer built afterwards gets the callback.

What the callback does, per hook (Lightning 2.6.6; docs/frameworks/lightning.md says why):
- after every optimizer step (`on_train_batch_end` of a batch that stepped, so once per step with
  `accumulate_grad_batches`), on every rank: `slurmddp.should_stop()`. When every rank agreed, each
  saves the step: `trainer.save_checkpoint` (every rank calls it, rank 0 writes it), its own RNG
  streams, and a completion marker written last; then `slurmddp.exit_for_requeue()`, which leaves
  `fit` through Lightning's own exception path (no collective) and skips what follows `fit`.
- Lightning's SIGTERM handler runs a broadcast inside the handler (it hung 300 s against DDP's
  all-reduce): the callback puts slurmddp's recording handler back right after Lightning registers
  its own, so a stop is acted on only at the agreed step.
- the resume point: the newest complete checkpoint (all markers there, sizes and CRC32s as
  recorded; incomplete and damaged ones skipped), chosen by rank 0 and broadcast, replaces what
  `fit(ckpt_path=None|"last")` resolved to unless that file is newer.
- on resume: the RNG streams of every rank, the sampler's epoch and the batches already trained in
  that epoch (the order continues mid-epoch, with DistributedSampler or any sampler whose order is
  a function of its epoch), and the TensorBoard/CSV loggers' `version_N` of the first attempt.

DDP's bucket rebuild after its first step (which a resumed attempt would reach one step later than
the uninterrupted run did) is not the callback's concern: slurmddp builds a resumed attempt's DDP
in the layout the first attempt's rebuilt to, in every script's process (`ddp.resume_buckets`,
job/script/ddp_buckets.py), so with 3 or more ranks the first step after a resume sums as the
uninterrupted run did.

The checkpoints live in `$SLURMDDP_RUN_DIR/lightning_checkpoints/step-NNNNNNNN/` (or `dirpath`).
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.files import fsync_dir, read_json_object, write_json
from slurmddp.integrations.shims import lightning as internals
from slurmddp.job.checkpoint import completeness
from slurmddp.job.checkpoint.completeness import AGREE, Kind, Wording
from slurmddp.job.checkpoint.integrity import (
    marker_name,
    rank_file_name,
    rank_markers,
    step_dir_name,
    step_dirs,
)
from slurmddp.job.checkpoint.io import file_crc32, write_stream_atomic
from slurmddp.job.checkpoint.rng import capture_rng_state, restore_rng_state
from slurmddp.job.process.stop import exit_for_requeue, should_stop
from slurmddp.job.script import report as search_report
from slurmddp.job.script import scriptrun

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # only the older package name is installed
    from pytorch_lightning import Callback as _Callback  # type: ignore[assignment]

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

CHECKPOINTS_DIR = "lightning_checkpoints"
"""Under the run directory: the checkpoints the callback saves at a stop."""
LIGHTNING_FILE = "lightning.ckpt"
"""Rank 0: the Trainer's checkpoint (`trainer.save_checkpoint`), what `fit(ckpt_path=...)` loads."""
_IMPORTED_AT = time.time()
"""Before the script built its Trainer and loggers: what a logger created later is this process's."""
LOGGERS_FILE = "loggers.json"
"""Beside the checkpoints: the first attempt's logger versions, which later attempts continue."""
KEEP_LAST = 2
_STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")


_NO_MARKER = "no completion marker from rank {rank}"
KIND = Kind(
    Wording(
        missing=_NO_MARKER,
        unreadable=_NO_MARKER,
        malformed=_NO_MARKER,
        unlisted="{marker} does not list {unlisted}",
    )
)
"""How the callback's checkpoints read the one completeness rule (job/checkpoint/completeness.py):
slurmddp's rank markers with lightning.ckpt in rank 0's; no meta.json names the attempt, so the
markers must agree on it among themselves."""


def checkpoint_problems(path: Path, world_size: int, *, check_crc: bool) -> list[str]:
    """Why `path` (a step directory) is not a complete checkpoint of `world_size` ranks; empty: it
    is. Complete: every rank's marker, all from one attempt, and every file with the size (and
    CRC32) its marker recorded."""
    markers = rank_markers(world_size, LIGHTNING_FILE)
    return completeness.problems(path, KIND, markers, attempt=AGREE, check_crc=check_crc)


def newest_complete(root: Path, world_size: int) -> Path | None:
    """The newest complete checkpoint under `root` (CRC32s checked), skipping, with a warning, any
    newer one that is incomplete or damaged."""
    found, skipped = completeness.newest_complete(
        (path for _, path in step_dirs(root)),
        lambda path: checkpoint_problems(path, world_size, check_crc=True),
    )
    for path, problems in skipped:
        print(f"slurmddp: skipping checkpoint {path}: {'; '.join(problems)}", file=sys.stderr, flush=True)
    return found


class _SkipFirst:
    """Stands in for a BatchSampler's sampler for one iteration: that iteration starts `skip`
    indices in, then the original sampler is put back. Its length is the whole epoch's, as Lightning
    counts the batches already trained into the epoch itself."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.sampler = batch_sampler.sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        self.batch_sampler.sampler = self.sampler
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


class SlurmddpCallback(_Callback):
    """Stop at the step every rank agreed on, save it completely, end for a requeue; resume from
    the newest complete checkpoint, mid-epoch, with every rank's RNG streams.

    `dirpath`: where the checkpoints go (default: `$SLURMDDP_RUN_DIR/lightning_checkpoints`, or
    the Trainer's `default_root_dir` outside a slurmddp job).
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self._position: dict[str, int] = {"epoch": 0, "consumed": 0}
        self._loaded: dict[str, int] | None = None
        self._resume: Path | None = None
        self._resumed_from: Path | None = None
        self._attempt = ""
        self._seen_step = -1
        self._ours: dict[int, Any] = {}

    # -- where ----------------------------------------------------------------------------------

    def root(self, trainer: Any) -> Path:
        if self.dirpath is not None:
            return self.dirpath
        run_dir = os.environ.get("SLURMDDP_RUN_DIR")
        if run_dir:
            return Path(run_dir) / CHECKPOINTS_DIR
        return Path(trainer.default_root_dir) / CHECKPOINTS_DIR

    # -- state Lightning saves in its checkpoints -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return dict(self._position)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = {key: int(state_dict[key]) for key in ("epoch", "consumed")}

    # -- hooks ----------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._keep_signal_handlers(trainer)
        newest = None
        if trainer.is_global_zero:
            found = newest_complete(self.root(trainer), trainer.world_size)
            newest = (str(found) if found else None, secrets.token_hex(8))
        # Every rank calls setup at the same point: one object broadcast, before anything loads.
        path, self._attempt = trainer.strategy.broadcast(newest, src=0)
        self._resume = Path(path) if path else None
        self._choose_resume_point(trainer)
        self._continue_loggers(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._restore_signal_handlers()
        # The optimizer steps of the whole fit (max_steps, or epochs x batches; inf where neither
        # bounds it): the run's ETA.
        total = trainer.estimated_stepping_batches
        if total != float("inf"):
            scriptrun.expect_total(int(total))
        self._seen_step = trainer.global_step
        if self._resumed_from is not None:
            rng = _load_local(self._resumed_from / rank_file_name(trainer.global_rank))
            self._resume_data(trainer, rng)
            internals.count_the_next_epoch(trainer.fit_loop)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._position = {"epoch": trainer.current_epoch, "consumed": batch_idx + 1}
        if trainer.global_step == self._seen_step:
            return  # an accumulating micro-batch: no optimizer step, no step boundary
        self._seen_step = trainer.global_step
        if should_stop():
            self._save(trainer)
            exit_for_requeue()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        # A search's trial: what validation logged (self.log("val_loss", ...)) goes to the study,
        # as Optuna's own Lightning pruning callback takes it.
        if not trainer.sanity_checking and search_report.in_search():
            search_report.report(trainer.global_step, **search_report.numbers(dict(trainer.callback_metrics)))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_signal_handlers()

    # -- signals ----------------------------------------------------------------------------------

    def _keep_signal_handlers(self, trainer: Any) -> None:
        """Lightning registers its SIGTERM handler (which broadcasts inside the handler) between
        the setup hook and the training; put slurmddp's back at once after it does."""
        self._ours = {}
        for name in _STOP_SIGNALS:
            signum = getattr(signal, name)
            handler = signal.getsignal(signum)
            if handler not in (None, signal.SIG_DFL, signal.SIG_IGN):
                self._ours[signum] = handler
        # Another Lightning, where nothing is wrapped: on_train_start puts them back.
        internals.after_signal_registration(trainer, self._restore_signal_handlers)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._ours.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)

    # -- the resume point -------------------------------------------------------------------------

    def _continue_loggers(self, trainer: Any) -> None:
        """A resumed attempt's TensorBoard and CSV loggers write into the first attempt's
        `version_N` directory, not a new `version_N+1`: one run in TensorBoard, continued. The
        first attempt's versions are kept beside the checkpoints (a version the script chose
        stays as it is)."""
        versioned = [logger for logger in trainer.loggers if internals.has_version(logger)]
        if not versioned:
            return
        path = self.root(trainer) / LOGGERS_FILE
        if self._resume is None:
            if trainer.is_global_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, {str(index): logger.version for index, logger in enumerate(versioned)})
            return
        saved = read_json_object(path) or {}
        for index, logger in enumerate(versioned):
            wanted = saved.get(str(index))
            if wanted is not None and logger.version != wanted:
                _repoint(logger, wanted, remove_opened=trainer.is_global_zero)

    def _choose_resume_point(self, trainer: Any) -> None:
        """Make Lightning restore from our newest complete checkpoint, unless the checkpoint it
        resolved itself (`ckpt_path="last"`: ModelCheckpoint's last.ckpt) is a newer file."""
        ours = self._resume

        def choose(checkpoint_path: Any) -> Any:
            chosen = checkpoint_path
            if (
                ours is not None
                and trainer.state.fn == "fit"
                and (not checkpoint_path or _mtime(checkpoint_path) <= _mtime(ours / LIGHTNING_FILE))
            ):
                chosen = str(ours / LIGHTNING_FILE)
            self._resumed_from = ours if ours is not None and chosen == str(ours / LIGHTNING_FILE) else None
            if self._resumed_from is not None and trainer.is_global_zero:
                print(f"slurmddp: resuming from {self._resumed_from}", file=sys.stderr, flush=True)
            return chosen

        internals.choose_restored_checkpoint(trainer, choose)

    # -- saving -----------------------------------------------------------------------------------

    def _save(self, trainer: Any) -> None:
        import torch

        rank, world_size = trainer.global_rank, trainer.world_size
        root = self.root(trainer)
        path = root / step_dir_name(trainer.global_step)
        path.mkdir(parents=True, exist_ok=True)
        marker = path / marker_name(rank)
        if marker.exists():
            # Left by an attempt that died saving this step: gone before the files change under it.
            marker.unlink()
            fsync_dir(path)
        files: dict[str, dict[str, Any]] = {}
        # Every rank calls it (the strategy decides who writes; DDP: rank 0, then a barrier).
        trainer.save_checkpoint(path / LIGHTNING_FILE)
        if rank == 0:
            with open(path / LIGHTNING_FILE, "rb") as handle:
                os.fsync(handle.fileno())
            files[LIGHTNING_FILE] = {
                "size": (path / LIGHTNING_FILE).stat().st_size,
                "crc32": file_crc32(path / LIGHTNING_FILE),
            }
        state = {"rng": capture_rng_state()}
        own = rank_file_name(rank)
        files[own] = write_stream_atomic(path / own, lambda f: torch.save(state, f))
        fsync_dir(path)
        write_json(
            marker,
            {
                "step": trainer.global_step,
                "rank": rank,
                "world_size": world_size,
                "attempt": self._attempt,
                "files": files,
            },
        )
        # All ranks are here at the same step: rank 0 prunes only once every marker is written.
        trainer.strategy.barrier("slurmddp-saved")
        if rank == 0:
            _prune(root, world_size, keep=KEEP_LAST)
            print(f"slurmddp: saved {path}", file=sys.stderr, flush=True)

    # -- resuming the data order and the RNG streams ----------------------------------------------

    def _resume_data(self, trainer: Any, rng: Mapping[str, Any]) -> None:
        """Continue the data where the saved step left it, and every RNG stream as it was after
        that step. A DataLoader iterator draws its base seed from the global torch RNG: the
        uninterrupted run made that draw at the start of each epoch, so the iterator is made again
        here before the RNG is restored (mid-epoch) or after (the step ended its epoch)."""
        loaders = _train_loaders(trainer)
        position = self._loaded or {"epoch": trainer.current_epoch, "consumed": 0}
        epoch, consumed = position["epoch"], position["consumed"]
        at_epoch_end = consumed >= trainer.num_training_batches
        stateful = [dl for dl in loaders if hasattr(dl, "state_dict") and hasattr(dl, "load_state_dict")]
        if stateful:
            # Lightning restored their position itself (e.g. torchdata's StatefulDataLoader).
            restore_rng_state(rng["rng"])
            return
        for dl in loaders:
            _set_epoch(dl, epoch + 1 if at_epoch_end else epoch)
            if not at_epoch_end and consumed:
                _skip(dl, consumed)
        fetcher = internals.data_fetcher(trainer)
        if fetcher is None or not loaders:
            print(
                "slurmddp: warning: found no training DataLoader or iterator to position (a Lightning "
                "other than 2.6.6?); the data order after this resume is Lightning's own",
                file=sys.stderr,
                flush=True,
            )
        if at_epoch_end:
            restore_rng_state(rng["rng"])
            if fetcher is not None:
                iter(fetcher)
        else:
            if fetcher is not None:
                iter(fetcher)
            restore_rng_state(rng["rng"])


def _repoint(logger: Any, version: Any, remove_opened: bool) -> None:
    """Point `logger` at `version`. Lightning opened this attempt's writer in a new version's
    directory before any callback's setup ran (to have the loggers' metadata early); that writer
    is closed, and its directory, holding only files made in this process, removed."""
    opened = Path(logger.log_dir)
    internals.repoint(logger, version)
    # Only rank 0 looks: the other ranks would race its removal. A directory holding anything
    # older than this process is another run's, and stays.
    if remove_opened and opened.is_dir() and all(_mtime(p) >= _IMPORTED_AT for p in opened.rglob("*")):
        shutil.rmtree(opened, ignore_errors=True)


def _mtime(path: Any) -> float:
    try:
        return Path(path).stat().st_mtime
    except (OSError, TypeError, ValueError):
        return float("-inf")


def _load_local(path: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def _prune(root: Path, world_size: int, keep: int) -> None:
    dirs = step_dirs(root)
    complete = [step for step, path in dirs if not checkpoint_problems(path, world_size, check_crc=False)]
    if len(complete) < keep:
        return
    oldest_kept = complete[keep - 1]
    for step, path in dirs:
        if step < oldest_kept:
            shutil.rmtree(path, ignore_errors=True)


def _train_loaders(trainer: Any) -> list[DataLoader[Any]]:
    from torch.utils.data import DataLoader

    return [dl for dl in internals.combined_loaders(trainer) if isinstance(dl, DataLoader)]


def _set_epoch(dl: DataLoader[Any], epoch: int) -> None:
    for sampler in (dl.sampler, getattr(dl.batch_sampler, "sampler", None)):
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def _skip(dl: DataLoader[Any], batches: int) -> None:
    from torch.utils.data import BatchSampler

    if not isinstance(dl.batch_sampler, BatchSampler) or isinstance(dl.batch_sampler.sampler, _SkipFirst):
        print(
            "slurmddp: warning: the training DataLoader has no BatchSampler of torch's; its epoch "
            "starts again from its first batch (give it a state_dict/load_state_dict to resume it)",
            file=sys.stderr,
            flush=True,
        )
        return
    batch_sampler = dl.batch_sampler
    batch_sampler.sampler = _SkipFirst(batch_sampler, batches * batch_sampler.batch_size)


def _add_callback(init: Any, callback_type: type) -> Any:
    def init_with_callback(trainer: Any, *args: Any, **kwargs: Any) -> None:
        callbacks = kwargs.get("callbacks")
        if callbacks is None:
            callbacks = []
        elif not isinstance(callbacks, list):
            callbacks = [callbacks]
        if not any(isinstance(cb, SlurmddpCallback) for cb in callbacks):
            callbacks = [*callbacks, callback_type()]
        kwargs["callbacks"] = callbacks
        init(trainer, *args, **kwargs)

    init_with_callback._slurmddp = True  # type: ignore[attr-defined]
    return init_with_callback


def auto() -> None:
    """Every Lightning Trainer built from now on gets a SlurmddpCallback (unless it has one):
    `lightning.pytorch`'s, and `pytorch_lightning`'s where that package is imported too."""
    for package in ("lightning.pytorch", "pytorch_lightning"):
        module = sys.modules.get(package)
        if module is None:
            continue
        trainer = module.Trainer
        if getattr(trainer.__init__, "_slurmddp", False):
            continue
        callback_type: type = SlurmddpCallback
        if not issubclass(SlurmddpCallback, module.Callback):
            callback_type = type("SlurmddpCallback", (SlurmddpCallback, module.Callback), {})
        trainer.__init__ = _add_callback(trainer.__init__, callback_type)
