"""What may go into a checkpoint, and the snapshot of an async save: prepare checks that a state
holds only what torch.load(weights_only=True) reads back and, for an async save, copies it (tensors
into CPU buffers kept by Snapshot, reused from the previous save); PendingSave tracks the background
write.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmddp.errors import CheckpointError

if TYPE_CHECKING:
    import torch

# Exactly the types torch.load(weights_only=True) reads back (checked on torch 2.13): no subclasses
# (a namedtuple, defaultdict or IntEnum pickles as its class and fails to load), no numpy.
_ATOMS: tuple[type, ...] = (type(None), bool, int, float, complex, str, bytes)


def _torch_atoms() -> tuple[type, ...]:
    import torch

    return (torch.Size, torch.dtype, torch.device)


class Snapshot:
    """CPU copies of the tensors of one async save, reusing the buffers of the previous one."""

    def __init__(self, spare: dict[str, torch.Tensor]) -> None:
        self.spare = spare
        self.taken: dict[str, torch.Tensor] = {}

    def copy(self, tensor: torch.Tensor, where: str) -> torch.Tensor:
        import torch

        source = tensor.detach()
        buffer = self.spare.pop(where, None)
        if (
            buffer is not None
            and source.layout == torch.strided
            and buffer.dtype == source.dtype
            and buffer.shape == source.shape
            and buffer.stride() == source.stride()
        ):
            buffer.copy_(source)
        else:
            buffer = source.to("cpu", copy=True)
        self.taken[where] = buffer
        return buffer


@dataclass
class PendingSave:
    step: int
    buffers: dict[str, torch.Tensor]
    thread: threading.Thread | None = None
    error: BaseException | None = None


def prepare(value: Any, where: str, snapshot: Snapshot | None) -> Any:
    """Check that `value` loads with weights_only=True; with a snapshot, also copy it (tensors to
    CPU memory, containers rebuilt) so the caller may change the original right away."""
    import torch

    kind = type(value)
    if kind in _ATOMS or kind in _torch_atoms():
        return value
    if isinstance(value, torch.Tensor):
        if kind not in (torch.Tensor, torch.nn.Parameter):
            raise CheckpointError(
                f"{where}: a {_type_name(kind)} (a tensor subclass) cannot be saved; save a plain tensor"
            )
        return snapshot.copy(value, where) if snapshot is not None else value
    if kind is dict or kind is collections.OrderedDict:
        out = kind()
        for key, item in value.items():
            if type(key) not in _ATOMS:
                raise CheckpointError(
                    f"{where}: key {key!r} is a {_type_name(type(key))}; use str or int keys"
                )
            out[key] = prepare(item, f"{where}[{key!r}]", snapshot)
        return out if snapshot is not None else value
    if kind is list or kind is tuple:
        items = [prepare(item, f"{where}[{i}]", snapshot) for i, item in enumerate(value)]
        if snapshot is None:
            return value
        return items if kind is list else tuple(items)
    if kind is set or kind is bytearray:
        for item in value if kind is set else ():
            if type(item) not in _ATOMS:
                raise CheckpointError(f"{where}: a set holding a {_type_name(type(item))} cannot be saved")
        return kind(value) if snapshot is not None else value
    hint = ""
    if "numpy" in kind.__module__:
        hint = " (for RNG states use slurmddp.job.checkpoint.capture_rng_state())"
    raise CheckpointError(
        f"{where}: a {_type_name(kind)} cannot be read back by torch.load(weights_only=True); "
        f"save tensors, numbers, strings, and lists, tuples and dicts of them{hint}"
    )


def _type_name(kind: type) -> str:
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
