"""The training-loop driver: resume, periodic checkpoints, and a stop that every rank takes together.

    for step in ctx.loop(total_steps, model=model, optimizer=optimizer):
        ...one training step...

At each step boundary the ranks exchange one small all-reduce that carries "a stop signal arrived"
and "a timed checkpoint is due". It is started at one boundary and read at the next, so it never
waits on the network; since every rank reads the same reduced value at the same boundary, all ranks
stop (or save) at the same step, one step after the signal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.files import write_json
from slurmddp.job import signals
from slurmddp.layout import PROGRESS, STOP

if TYPE_CHECKING:
    from slurmddp.job.checkpoint import CheckpointStore

# Rank 0 records how far it got at most this often, for the attempt log of a crashed attempt.
PROGRESS_EVERY_S = 2.0


class StopForRequeue(BaseException):
    """Raised out of the loop once every rank has saved after a stop signal.

    A BaseException, so that a user's `except Exception` around the step cannot swallow it.
    """

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"stopped at step {step} on {signals.name(signum)}; the job will be requeued")
        self.step = step
        self.signum = signum


class TrainLoop:
    """Iterates over step numbers from the last checkpoint (or 0) to `total_steps`."""

    def __init__(
        self,
        *,
        total_steps: int,
        rank: int,
        device: Any,
        run_dir: Path,
        store: CheckpointStore,
        every_steps: int,
        every_minutes: float,
        restart_count: int,
        job_id: str,
        objects: Mapping[str, Any],
        extra: dict[str, Any],
    ) -> None:
        import torch

        self.total_steps = total_steps
        self.rank = rank
        self.run_dir = run_dir
        self.store = store
        self.every_steps = every_steps
        self.every_s = every_minutes * 60
        self.attempt = {"job_id": job_id, "restart_count": restart_count}
        self.objects = {name: obj for name, obj in objects.items() if obj is not None}
        self.extra = extra
        """User values saved with every checkpoint and restored on resume (rank 0's are kept)."""
        self.step = 0
        self.first_step = 0
        """The step this attempt started from (0, or the checkpoint it resumed)."""
        self.last_save_s = 0.0
        self._saved_at = time.monotonic()
        self._saved_step = -1
        self._progress_at = 0.0
        self._flags = torch.zeros(2, dtype=torch.int32, device=device)
        self._pending: Any = None
        self._resume()

    def _resume(self) -> None:
        from slurmddp.job.checkpoint import restore_rng_state

        info = self.store.latest()
        if info is None:
            return
        shared, local = self.store.load(info)
        for name, obj in self.objects.items():
            obj.load_state_dict(shared[name])
        self.extra.update(shared.get("extra", {}))
        restore_rng_state(local["rng"])
        self.step = self._saved_step = self.first_step = info.step
        if self.rank == 0:
            print(f"slurmddp: resumed from {info.path} at step {info.step}", flush=True)

    def __iter__(self) -> Iterator[int]:
        while self.step < self.total_steps:
            self._boundary()
            yield self.step
            self.step += 1
        self.store.wait()
        self._drain()

    def save(self) -> None:
        """Checkpoint the state after `self.step` steps (every rank must call it at the same step)."""
        from slurmddp.job.checkpoint import capture_rng_state

        if self._saved_step == self.step:
            return
        started = time.perf_counter()
        shared = None
        if self.rank == 0:
            shared = {name: obj.state_dict() for name, obj in self.objects.items()}
            shared["extra"] = dict(self.extra)
        self.store.save(self.step, shared, {"rng": capture_rng_state()})
        self.store.prune()
        self.last_save_s = time.perf_counter() - started
        self._saved_at = time.monotonic()
        self._saved_step = self.step

    def _boundary(self) -> None:
        import torch.distributed as tdist

        stop, timed_save = self._agreed()
        if self.rank == 0:
            self._progress()
        if stop:
            self.save()
            self.store.wait()
            # Every rank's files are durable past this point, so rank 0 may requeue (which ends
            # the job at once) as soon as it is out of the loop.
            tdist.barrier()
            self._record_stop(stop)
            raise StopForRequeue(self.step, stop)
        if timed_save or (self.every_steps and self.step % self.every_steps == 0 and self.step > 0):
            self.save()
        self._flags[0] = signals.received() or 0
        self._flags[1] = int(
            self.rank == 0 and self.every_s > 0 and time.monotonic() - self._saved_at >= self.every_s
        )
        self._pending = tdist.all_reduce(self._flags, op=tdist.ReduceOp.MAX, async_op=True)

    def _agreed(self) -> tuple[int, bool]:
        """The flags every rank reported at the previous boundary."""
        if self._pending is None:
            return 0, False
        self._pending.wait()
        self._pending = None
        return int(self._flags[0].item()), bool(self._flags[1].item())

    def _drain(self) -> None:
        # The last boundary's all-reduce must finish before the process group goes away.
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            record = {"step": self.step, "time": time.time(), "last_save_s": round(self.last_save_s, 3)}
            write_json(self.run_dir / PROGRESS, {**record, **self.attempt})

    def _record_stop(self, signum: int) -> None:
        if self.rank == 0:
            record = {
                "step": self.step,
                "signal": signals.name(signum),
                "signal_at": signals.received_at(),
                "save_s": round(self.last_save_s, 3),
                "time": time.time(),
                **self.attempt,
            }
            write_json(self.run_dir / STOP, record)
