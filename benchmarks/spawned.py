"""Rank processes of a one-machine benchmark, and what rank 0 hands back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def run_ranks(main: Callable[..., None], args: tuple[Any, ...], ranks: int) -> Any:
    """Spawn `ranks` processes of `main(rank, *args, queue)`; what rank 0 puts on the queue. Read
    before the ranks are joined: rank 0's results can outgrow the pipe's buffer (1000 rounds of
    stop_overhead.py did), and it would wait on the pipe forever while they were awaited."""
    queue: Any = mp.get_context("spawn").SimpleQueue()
    context = mp.start_processes(main, args=(*args, queue), nprocs=ranks, start_method="spawn", join=False)
    assert context is not None
    while queue.empty():
        # Raises once a rank failed: its results would never come.
        context.join(timeout=1)
    result = queue.get()
    while not context.join():
        pass
    return result
