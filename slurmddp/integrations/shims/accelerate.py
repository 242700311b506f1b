"""accelerate's undocumented attributes used by slurmddp's accelerate helper
(integrations/accelerate.py), and nowhere else. None is underscored, but accelerate's docs do not
name them either; each accessor's docstring says which versions it was checked on and why.
accelerate itself is not imported: the objects are the script's.
"""

from __future__ import annotations

from typing import Any

TESTED_VERSIONS = ("1.15.0",)
"""The accelerate versions every accessor below was checked on."""
INTERNALS = (
    "accelerator.step",
    "loader.get_sampler",
    "sampler.initial_seed",
)
"""Every undocumented name reached below, from an Accelerator (`accelerator`), a DataLoader it
prepared (`loader`) and the seedable sampler of one (`sampler`)."""


def accumulation_step(accelerator: Any) -> int:
    """The micro-batches `accelerator.accumulate` counted (checked on accelerate 1.15.0); 0 where
    it counts none. Undocumented: `Accelerator.step`; a resume mid-accumulation must continue the
    count, or the next optimizer step syncs gradients at another micro-batch."""
    return int(getattr(accelerator, "step", 0))


def set_accumulation_step(accelerator: Any, step: int) -> None:
    """Continue `accumulate`'s count from `step` (see accumulation_step)."""
    if hasattr(accelerator, "step"):
        accelerator.step = step


def loader_sampler(dataloader: Any) -> Any:
    """The sampler a prepared loader draws its order from (checked on accelerate 1.15.0).
    Undocumented: `DataLoaderShard.get_sampler()`; accelerate puts the sampler inside the loader's
    batch sampler (or inside a batch sampler given as `sampler`), and this finds it in either place.
    A loader without it: its `sampler`."""
    get_sampler = getattr(dataloader, "get_sampler", None)
    return get_sampler() if callable(get_sampler) else getattr(dataloader, "sampler", None)


def sampler_seed(sampler: Any) -> int | None:
    """The seed of a seedable sampler (`use_seedable_sampler=True`), or None for another sampler
    (checked on accelerate 1.15.0). Undocumented: `SeedableRandomSampler.initial_seed`; a resume
    compares it with the saved one, as the data order is a function of it and the epoch alone."""
    seed = getattr(sampler, "initial_seed", None)
    return int(seed) if seed is not None else None
