"""RNG state in loadable types: capture_rng_state() gives the states of torch (CPU and every CUDA
device), Python `random` and numpy's global RNG as tensors, ints and tuples that
torch.load(weights_only=True) reads back; restore_rng_state() puts them back.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, cast


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU, every CUDA device), Python `random` and numpy's global RNG, as tensors, ints and
    tuples that torch.load(weights_only=True) reads back (numpy's own state holds an ndarray)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached_gaussian = cast(tuple[Any, ...], np.random.get_state(legacy=True))
    state["numpy"] = {
        "kind": str(kind),
        # uint32 -> int64 tensor: exact, and a dtype every torch version serializes.
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Undo capture_rng_state(): every generator continues where it was captured."""
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        saved = state["numpy"]
        keys = saved["keys"].numpy().astype(np.uint32)
        np.random.set_state((saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
