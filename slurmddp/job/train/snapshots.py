"""In-memory snapshots for the training loop: when to take one, taking it, and restarting from one.

Every few steps, at a step boundary, each node's local rank 0 copies the state every rank shares
under DDP (model, optimizer, ...) into CPU buffers, and every rank starts gathering every rank's own
state (its RNG streams, a fixed-size slot each) without waiting for it; at the next boundary, the
gather done during the step, the writer writes both into the node's memory
(job/checkpoint/memory.py) in the background. The training path pays the copy and the pickling
of about 15 KB. A crash restarted in the allocation then resumes from the newest snapshot any node
holds instead of the last checkpoint on disk; a node that holds none (a spare that replaced a lost
node) gets it from one that does.

How often: `checkpoint.snapshot_every_steps`, or, unset, as often as keeps a snapshot's measured
cost under 1% of the step time, aiming at half (job/train/cadence.py). Rank 0 decides and says so
in the loop's boundary all-reduce, with each node's "still writing" flag, so every rank takes the
same snapshots at the same steps without a collective of their own.
"""

from __future__ import annotations

import pickle
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.defaults import SNAPSHOTS_ENV
from slurmddp.errors import CheckpointError
from slurmddp.job.checkpoint.memory import Loaded, NodeSnapshots, file_name, load
from slurmddp.job.train.cadence import Cadence

if TYPE_CHECKING:
    import torch

    from slurmddp.experiment.schema import Checkpoint
    from slurmddp.job.process.distenv import DistEnv

SLOT = 64 * 1024
"""Bytes a rank's own state may take in a snapshot (a CPU rank's RNG streams pickle to 14.6 KB)."""
_LENGTH = 8


@dataclass
class _Gathering:
    """A snapshot taken at a boundary, its ranks' own states still on their way."""

    step: int
    work: Any
    slots: list[torch.Tensor]
    copied: Any


@dataclass(frozen=True)
class Restored:
    """The snapshot a restarted attempt resumes from."""

    loaded: Loaded
    where: str
    """The file it came from, on the first node that had it."""
    blob: bytes

    def shared(self) -> dict[str, Any]:
        """A fresh copy of the shared state (the priming step changes what was applied)."""
        return load(self.blob).shared


def node_folder(env: Mapping[str, str]) -> Path | None:
    """This node's snapshot folder, where the batch script set one up."""
    base = env.get(SNAPSHOTS_ENV)
    if not base:
        return None
    return Path(base) / (env.get("SLURMD_NODENAME") or socket.gethostname())


class Snapshots:
    """One rank's part in the run's in-memory snapshots."""

    def __init__(self, folder: Path, dist: DistEnv, every: int | None, device: Any) -> None:
        self.device = device
        self.rank = dist.rank
        self.world_size = dist.world_size
        self.node = NodeSnapshots(folder) if dist.local_rank == 0 else None
        """This node's snapshots, on the rank that writes them."""
        self.reader = NodeSnapshots(folder)
        self.first_of_allocation = dist.in_job_restart == 0
        self.cadence = Cadence(every)
        """When to take one: rank 0's to decide."""
        self.taken = 0
        """Snapshots rank 0 took in this attempt."""
        self.said: int | None = None
        """The interval rank 0's log said last."""
        self._gathering: _Gathering | None = None

    @classmethod
    def open(
        cls, env: Mapping[str, str], settings: Checkpoint, dist: DistEnv, device: Any
    ) -> Snapshots | None:
        """`device`: where the ranks' collectives run (the gather's slots go there)."""
        folder = node_folder(env)
        if folder is None or settings.snapshot_every_steps == 0 or dist.world_size < 2:
            return None
        return cls(folder, dist, settings.snapshot_every_steps, device)

    # -- when -----------------------------------------------------------------------------------

    def due_after(self, step: int, first_step: int, paused: bool) -> bool:
        """Rank 0, at the boundary before `step`: should every rank take one at the next boundary
        (after `step + 1` steps)? `paused`: see Cadence.due_after."""
        return self.cadence.due_after(step, time.perf_counter(), self.busy(), first_step, paused)

    def busy(self) -> bool:
        """This node is still writing the last one (the next waits until no node is)."""
        return self.node is not None and self.node.busy()

    def kept(self, step: int) -> None:
        """A state as new as `step` is kept (a checkpoint, or the start)."""
        self.cadence.took(step, None)

    # -- taking ---------------------------------------------------------------------------------

    def take(self, step: int, shared: Callable[[], dict[str, Any]], local: dict[str, Any]) -> None:
        """Every rank at the same boundary: start gathering the ranks' own state; each node's writer
        copies the shared state. `settle` at the next boundary writes them."""
        import torch
        import torch.distributed as tdist

        began = time.perf_counter()
        payload = pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL)
        slot = torch.zeros(SLOT, dtype=torch.uint8)
        # The length first; -1: more than a slot holds (the writers then write nothing).
        fits = len(payload) <= SLOT - _LENGTH
        slot[:_LENGTH] = torch.frombuffer(
            bytearray((len(payload) if fits else -1).to_bytes(_LENGTH, "little", signed=True)),
            dtype=torch.uint8,
        )
        if fits:
            slot[_LENGTH : _LENGTH + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        slot = slot.to(self.device)
        slots = [torch.empty_like(slot) for _ in range(self.world_size)]
        work = tdist.all_gather(slots, slot, async_op=True)
        copied = None
        if self.node is not None:
            try:
                # The previous write's error, if it had one, comes out here.
                copied = self.node.copy(shared())
            except (CheckpointError, OSError) as exc:
                self._stop_writing(exc)
        self._gathering = _Gathering(step, work, slots, copied)
        self.cadence.write_s = self.node.write_s if self.node is not None else 0.0
        self.cadence.took(step, time.perf_counter() - began)
        self.taken += 1
        # By the third, the first write's effect on the steps it overlapped is measured; after it,
        # the log says the interval again where it moved (restarts redo up to the one in effect).
        if self.rank == 0 and self.taken >= 3 and self.cadence.worth_saying(self.said):
            self._say_interval()

    def settle(self) -> None:
        """Every rank, at each boundary: the gather started at the last one is done (during the
        step); the writer starts writing the snapshot."""
        gathering, self._gathering = self._gathering, None
        if gathering is None:
            return
        began = time.perf_counter()
        try:
            self._write_gathered(gathering)
        finally:
            self.cadence.settled(time.perf_counter() - began)

    def _write_gathered(self, gathering: _Gathering) -> None:
        gathering.work.wait()
        if self.node is None or gathering.copied is None:
            return
        locals_ = []
        for rank, slot in enumerate(gathering.slots):
            data = slot.cpu().numpy().tobytes()
            length = int.from_bytes(data[:_LENGTH], "little", signed=True)
            if length < 0:
                self._stop_writing(
                    CheckpointError(f"rank {rank}'s own state (RNG streams) takes more than {SLOT} bytes")
                )
                return
            locals_.append(pickle.loads(data[_LENGTH : _LENGTH + length]))
        self.node.write(gathering.step, self.world_size, gathering.copied, locals_)

    def _stop_writing(self, why: Exception) -> None:
        # This node takes no more (the others go on); a restart finds a node that has one.
        self.node = None
        print(
            f"slurmddp: warning: rank {self.rank}: an in-memory snapshot was not written, and this "
            f"node takes no more: {why}",
            flush=True,
        )

    def _say_interval(self) -> None:
        cadence = self.cadence
        how = (
            "checkpoint.snapshot_every_steps"
            if cadence.every is not None
            else f"chosen: one costs {1000 * (cadence.cost_s() or 0):.2f} ms, "
            f"{1000 * (cadence.sync_s or 0):.2f} of it on the training path; a step "
            f"{1000 * (cadence.idle_step_s or 0):.1f} ms"
        )
        self.said = cadence.interval()
        print(f"slurmddp: in-memory snapshots every {self.said} steps ({how})", flush=True)

    def clear(self) -> None:
        """Every rank: the run saved what it needs on disk, or ended: free the node's memory."""
        if self._gathering is not None:
            # A collective every rank started: finished here, before the process group goes.
            self._gathering.work.wait()
            self._gathering = None
        if self.node is not None:
            self.node.clear()

    # -- restarting -----------------------------------------------------------------------------

    def restore(self, disk_step: int | None) -> Restored | None:
        """Every rank, on a restart in the allocation (`first_of_allocation` False: the folder is the
        allocation's own, so its first attempt finds nothing): the newest snapshot any node holds,
        when it is newer than the newest checkpoint on disk (`disk_step`), loaded on every rank
        (sent by a node that holds it to those that do not); None when there is none, or any rank
        could not load it."""
        import torch.distributed as tdist

        from slurmddp.job.train.metrics import first_problem, gather

        untrusted = self.reader.untrusted()
        if untrusted is not None:
            print(
                f"slurmddp: warning: rank {self.rank}: not reading in-memory snapshots: {untrusted}",
                flush=True,
            )
        mine = self.reader.newest() if untrusted is None else None
        found: list[tuple[int | None, str]] = gather((mine, str(self.reader.folder)))
        seen = [step for step, _ in found]
        held = [step for step in seen if step is not None]
        if not held or (disk_step is not None and disk_step >= max(held)):
            return None
        step = max(held)
        source = seen.index(step)
        blob: bytes | None = None
        problem: str | None = None
        if mine == step:
            try:
                blob = self.reader.read(step)
            except OSError as exc:
                problem = f"cannot read {self.reader.path(step)}: {exc}"
        if any(other != step for other in seen):
            box = [blob if self.rank == source else None]
            tdist.broadcast_object_list(box, src=source)
            blob = blob if blob is not None else box[0]
        loaded = None
        if blob is None:
            problem = problem or f"rank {source} could not send the snapshot of step {step}"
        else:
            try:
                loaded = load(blob)
            except CheckpointError as exc:
                problem = str(exc)
            if loaded is not None and loaded.world_size != self.world_size:
                problem = f"it was taken by {loaded.world_size} ranks, this attempt has {self.world_size}"
        problem = first_problem(problem)
        if problem is not None:
            if self.rank == 0:
                print(
                    f"slurmddp: not resuming from the in-memory snapshot of step {step}: {problem}; "
                    "from the newest checkpoint instead",
                    flush=True,
                )
            return None
        assert loaded is not None and blob is not None
        return Restored(loaded, str(Path(found[source][1]) / file_name(step)), blob)
