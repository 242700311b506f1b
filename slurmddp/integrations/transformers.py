"""HF transformers' `Trainer`, preemption-safe by one line (docs/frameworks/transformers.md):

    trainer = Trainer(..., callbacks=[SlurmddpCallback()])

At the end of every optimizer step (gradient accumulation included: Trainer calls `on_step_end`
once per optimizer step) every rank asks `slurmddp.should_stop()`. When the ranks agreed to stop,
Trainer saves its own `checkpoint-N` at that step, every rank waits until the checkpoint is durable
and marked complete, and the attempt ends with `slurmddp.exit_for_requeue()`: `trainer.train()`
raises, so nothing the script does after it (a final save, an evaluation, a push) runs. At an
epoch's last step the save waits for the epoch's end (its evaluation draws from the RNG before the
next epoch's batches); an attempt resumed where training had ended (max_steps, early stopping)
only finishes.

Completeness. Trainer writes `checkpoint-N` in place, with no mark of completion (only its JIT
checkpoint leaves `checkpoint-is-incomplete.txt` there while it saves, and `get_last_checkpoint`
picks such a directory all the same). After every save Trainer makes, every rank waits for the
others, the first rank of each node fsyncs the checkpoint's files, and rank 0 writes
`slurmddp-complete.json` (the files and their sizes) by temp file, fsync and rename, and the ranks
wait for it. A checkpoint counts only with that marker, its files at their sizes, and no JIT
sentinel.

The resume point. The callback patches `Trainer.train` (once, for every Trainer; it acts only on a
Trainer the callback is attached to): inside a slurmddp job, whatever `resume_from_checkpoint` says
(None, False, True, or the path `get_last_checkpoint` returned, as transformers' examples do), the
newest complete checkpoint in `args.output_dir` is the resume point, rank 0 chooses it for every
rank, and the incomplete ones newer than it are moved to `output_dir/slurmddp-incomplete/`
(Trainer would otherwise save into such a directory again, and `get_last_checkpoint` pick it).
Without one, a path elsewhere (another run's checkpoint to start from) is kept; otherwise training
starts from the beginning. Outside a job only a request for the last checkpoint (True, or a
`checkpoint-N` of `output_dir`) is resolved, to the newest complete one.

Exactness: Trainer restores the data order, the RNG streams and every state it saved. DDP's
gradient buckets need nothing here: with Trainer's default for a PreTrainedModel
(`ddp_find_unused_parameters=True`) DDP never rebuilds them, and with False slurmddp builds a
resumed attempt's DDP in the layout the first attempt rebuilt to, for every script
(`ddp.resume_buckets`, job/script/ddp_buckets.py).

`auto()` gives every Trainer built afterwards the callback, for scripts left unchanged.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from slurmddp.files import fsync_dir, write_json
from slurmddp.integrations.shims import transformers as internals
from slurmddp.job.checkpoint import completeness
from slurmddp.job.checkpoint.completeness import UNCHECKED, Kind, Marker, Wording
from slurmddp.job.process import stop
from slurmddp.job.script import report as search_report
from slurmddp.job.script import scriptrun

__all__ = ["COMPLETE", "SlurmddpCallback", "auto", "checkpoint_problem", "newest_complete", "resume_point"]

COMPLETE = "slurmddp-complete.json"
"""The marker rank 0 writes into `checkpoint-N` once every rank's files of it are durable."""
JIT_SENTINEL = "checkpoint-is-incomplete.txt"
"""What transformers' JIT checkpoint (`enable_jit_checkpoint`) leaves in a checkpoint it is saving."""
SET_ASIDE = "slurmddp-incomplete"
"""Where incomplete checkpoints newer than the resume point go, under `args.output_dir`."""
_PREFIX = PREFIX_CHECKPOINT_DIR + "-"
_UNREADABLE = "its {marker} cannot be read ({error})"
KIND = Kind(
    Wording(
        missing="it has no {marker} (its save did not finish, or it was not saved with SlurmddpCallback)",
        unreadable=_UNREADABLE,
        malformed=_UNREADABLE,
        unlisted="{marker} does not list {unlisted}",
        changed="{problem}",
    ),
    sentinels=(JIT_SENTINEL,),
    bare_sizes=True,
    every_listed=True,
)
"""How `checkpoint-N` reads the one completeness rule (job/checkpoint/completeness.py): rank 0's
one marker, written once every rank's files are durable, stands for every rank's and names no
attempt; it records every file of the folder by its size alone; and transformers' JIT sentinel
means the save did not finish, whatever the marker says."""


def _say(message: str) -> None:
    print(f"slurmddp: {message}", file=sys.stderr, flush=True)


def _output_dir(args: TrainingArguments) -> Path:
    return Path(str(args.output_dir))


def in_job() -> bool:
    """Whether this process is a slurmddp job's script (the rank gave it the stop store)."""
    return bool(os.environ.get(stop.STORE_ENV))


# ---- Completeness ------------------------------------------------------------------------------


def _files(folder: Path) -> dict[str, int]:
    """Every file under `folder` but the marker, by relative path, with its size."""
    return {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.name.startswith((COMPLETE, f".{COMPLETE}"))
    }


def _fsync_tree(folder: Path) -> None:
    """Make every file under `folder`, and the folder entries that name them, durable."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file() or path.is_dir():
            # fsync_dir opens read-only and fsyncs: a file's contents as well as a folder's entries.
            fsync_dir(path)
    fsync_dir(folder)
    fsync_dir(folder.parent)


def write_marker(folder: Path, step: int, world_size: int) -> None:
    """Mark `folder` complete: its files and their sizes, by temp file, fsync and rename."""
    record = {"step": step, "world_size": world_size, "time": time.time(), "files": _files(folder)}
    write_json(folder / COMPLETE, record)


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint, or None when it is."""
    problems = completeness.problems(folder, KIND, [Marker(COMPLETE)], attempt=UNCHECKED)
    return problems[0] if problems else None


def _step(folder: Path) -> int | None:
    tail = folder.name[len(_PREFIX) :]
    return int(tail) if folder.name.startswith(_PREFIX) and tail.isdigit() else None


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """The `checkpoint-N` directories of `output_dir`, newest first."""
    try:
        entries = list(output_dir.iterdir())
    except OSError:
        return []
    found = [(step, path) for path in entries if (step := _step(path)) is not None and path.is_dir()]
    return sorted(found, reverse=True)


def newest_complete(output_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint of `output_dir` (None: none), and the incomplete ones newer
    than it, each with why."""
    found, skipped = completeness.newest_complete(
        (path for _, path in checkpoints(output_dir)),
        lambda path: [problem] if (problem := checkpoint_problem(path)) is not None else [],
    )
    return found, [(path, problems[0]) for path, problems in skipped]


def resume_point(
    requested: str | bool | None, output_dir: Path, job: bool
) -> tuple[str | None, list[tuple[Path, str]]]:
    """Where `trainer.train(resume_from_checkpoint=requested)` resumes, and the incomplete
    checkpoints newer than that point (to be set aside). Pure but for reading `output_dir`."""
    newest, skipped = newest_complete(output_dir)
    own = isinstance(requested, str) and Path(requested).resolve().parent == output_dir.resolve()
    if job:
        if newest is not None:
            return str(newest), skipped
        if isinstance(requested, str) and not own:
            return requested, skipped
        return None, skipped
    if requested is True or own:
        if newest is None and requested is True:
            raise ValueError(f"no complete checkpoint in {output_dir}")
        return (str(newest) if newest is not None else None), skipped
    return (requested or None), []


def set_aside(output_dir: Path, skipped: list[tuple[Path, str]]) -> None:
    """Move incomplete checkpoints out of Trainer's way, each with a reason.txt."""
    for path, problem in skipped:
        target = output_dir / SET_ASIDE / path.name
        n = 1
        while target.exists():
            n += 1
            target = output_dir / SET_ASIDE / f"{path.name}.{n}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        (target / "reason.txt").write_text(f"{problem}\n")
        _say(f"skipping incomplete checkpoint {path}: {problem}; moved to {target}")


# ---- The callback ------------------------------------------------------------------------------


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class SlurmddpCallback(TrainerCallback):
    """Makes a `Trainer` preemption-safe: `Trainer(..., callbacks=[SlurmddpCallback()])`.

    On the step every rank agreed to stop at (`slurmddp.should_stop()`), Trainer saves its own
    `checkpoint-N`, every rank waits until it is durable and marked complete, and `trainer.train()`
    ends with `slurmddp.StopForRequeue`; the next attempt resumes from the newest complete
    checkpoint. Every other save is marked complete too. Outside a slurmddp job it only marks
    saves complete.
    """

    def __init__(self) -> None:
        _patch_train()
        self.trainer: Trainer | None = None
        """The Trainer running now (set by the patched `Trainer.train`)."""
        self.stopping = False
        self.resumed = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        trainer = self.trainer
        # Trainer has worked out its max_steps by now (from epochs too): the run's ETA.
        scriptrun.expect_total(state.max_steps)
        if not (self.resumed and state.global_step > 0 and trainer is not None):
            return
        if _training_had_ended(state):
            # Resumed from a stop at the step where training ended (max_steps, or a callback such
            # as early stopping asked it to): Trainer would go on with the next step before it
            # checks (transformers 5.24), so this attempt only finishes (the script's code after
            # train() runs): Trainer's own epoch is replaced for this call.
            def finished(**_: Any) -> None:
                trainer.control.should_training_stop = True

            internals.replace_epoch(trainer, finished)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if stop.should_stop():
            self.stopping = True
            # At an epoch's last step (or the run's), the save waits for the epoch's end: the
            # uninterrupted run evaluates there (which draws from the RNG) before the next batch.
            ends_epoch = state.epoch is not None and float(state.epoch).is_integer()
            if not (ends_epoch or 0 < state.max_steps <= state.global_step):
                control.should_save = True

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.stopping:
            control.should_save = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        folder = _output_dir(args) / f"{_PREFIX}{state.global_step}"
        if folder.is_dir():
            # Every rank wrote its part; then the first rank of each node makes its node's writes
            # durable, and rank 0 marks the checkpoint once all are.
            _barrier()
            if args.local_process_index == 0:
                _fsync_tree(folder)
            _barrier()
            if args.process_index == 0:
                write_marker(folder, state.global_step, args.world_size)
            _barrier()
        if self.stopping:
            self._stop(state)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # A search's trial: what Trainer logs (eval_loss after an evaluation) goes to the study.
        if logs and search_report.in_search():
            search_report.report(state.global_step, **search_report.numbers(logs))

    def _stop(self, state: TrainerState) -> None:
        if stop.stopped_at() is not None:
            _say(f"saved checkpoint-{state.global_step} for the stop; the job will be requeued")
        stop.exit_for_requeue()

    def _save_if_stopping(self) -> None:
        """A stop whose save Trainer dropped (save_strategy="best" sets `should_save` after an
        evaluation, over the callback's) is saved here, before the next batch is drawn."""
        if self.stopping and self.trainer is not None:
            internals.save_checkpoint(self.trainer)
            self._stop(self.trainer.state)

    def on_step_begin(self, *_: Any, **__: Any) -> None:
        self._save_if_stopping()

    def on_epoch_begin(self, *_: Any, **__: Any) -> None:
        self._save_if_stopping()

    def on_train_end(self, *_: Any, **__: Any) -> None:
        self._save_if_stopping()


def _training_had_ended(state: TrainerState) -> bool:
    """Whether the checkpoint `state` was loaded from was saved where training ended: at
    `max_steps`, or with Trainer's control saying stop (saved in `trainer_state.json`)."""
    # A dict once TrainerState was built or loaded, whatever its annotation says.
    stored: Any = state.stateful_callbacks
    control = stored.get("TrainerControl") if isinstance(stored, dict) else None
    asked = isinstance(control, dict) and control.get("args", {}).get("should_training_stop") is True
    return asked or 0 < state.max_steps <= state.global_step


# ---- Trainer.train, patched --------------------------------------------------------------------

_ORIGINAL_TRAIN = "_slurmddp_original_train"


def _ours(trainer: Trainer) -> SlurmddpCallback | None:
    for callback in internals.callbacks(trainer):
        if isinstance(callback, SlurmddpCallback):
            return callback
    return None


def _choose(trainer: Trainer, requested: str | bool | None) -> str | None:
    """The resume point, chosen by rank 0 for every rank (a shared filesystem may show ranks on
    other nodes an older listing)."""
    args = trainer.args
    output_dir = _output_dir(args)
    chosen: list[Any] = [None, None]
    if args.process_index == 0:
        try:
            point, skipped = resume_point(requested, output_dir, in_job())
            set_aside(output_dir, [(p, why) for p, why in skipped if point is None or _newer(p, point)])
            chosen = [point, None]
        except ValueError as exc:
            chosen = [None, str(exc)]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(chosen, src=0)
    if chosen[1] is not None:
        raise ValueError(chosen[1])
    point = chosen[0]
    if args.process_index == 0 and point is not None:
        _say(f"resuming from {point}")
    return point  # type: ignore[no-any-return]


def _newer(path: Path, than: str) -> bool:
    return (_step(path) or 0) > (_step(Path(than)) or -1)


def _patch_train() -> None:
    """Wrap `Trainer.train` once: a Trainer with the callback attached resumes from the newest
    complete checkpoint (module doc)."""
    if hasattr(Trainer, _ORIGINAL_TRAIN):
        return
    original: Callable[..., Any] = Trainer.train

    @functools.wraps(original)
    def train(
        self: Trainer, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        callback = _ours(self)
        if callback is None:
            return original(self, resume_from_checkpoint, *args, **kwargs)
        if self.args.enable_jit_checkpoint and in_job():
            _say(
                "warning: enable_jit_checkpoint saves on its own SIGTERM handler, at another step on "
                "each rank; SlurmddpCallback saves at the step the ranks agree on: turn it off"
            )
        if self.args.save_only_model and in_job():
            _say(
                "warning: save_only_model=True saves no optimizer, scheduler or RNG state: a "
                "requeued attempt cannot resume the training exactly; set it to False"
            )
        point = _choose(self, resume_from_checkpoint)
        # Last, so that every other callback has seen a save before the stop ends the attempt.
        internals.callbacks(self).remove(callback)
        internals.callbacks(self).append(callback)
        callback.trainer = self
        callback.stopping = False
        callback.resumed = point is not None
        try:
            return original(self, point, *args, **kwargs)
        finally:
            callback.trainer = None
            internals.restore_epoch(self)

    setattr(Trainer, _ORIGINAL_TRAIN, original)
    Trainer.train = train  # type: ignore[method-assign]


# ---- Zero-change mode --------------------------------------------------------------------------

_ORIGINAL_INIT = "_slurmddp_original_init"


def auto() -> None:
    """Give every `Trainer` built from now on a `SlurmddpCallback`, unless it has one: the script
    needs no change. Call it in the script's process before the Trainer is built."""
    if hasattr(Trainer, _ORIGINAL_INIT):
        return
    _patch_train()
    original: Callable[..., None] = Trainer.__init__

    @functools.wraps(original)
    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _ours(self) is None:
            self.add_callback(SlurmddpCallback())

    setattr(Trainer, _ORIGINAL_INIT, original)
    Trainer.__init__ = __init__  # type: ignore[method-assign]
