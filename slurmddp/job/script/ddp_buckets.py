"""A resumed script's DDP sums its gradients in the order the uninterrupted run did.

DistributedDataParallel lays out its gradient buckets once when it is built, and again, for good,
after its first backward, in the order the gradients became ready (torch 2.13: one bucket of every
parameter in index order, then buckets of 1 MiB and 25 MiB in ready order). Where a value sits in a
bucket decides the order in which the ranks' values are summed (gloo's ring, NCCL's chunks), so a
resumed process, whose first step runs in the initial layout where the uninterrupted run used the
rebuilt one, gets other bits with 3 or more ranks (docs/resume.md, "The priming step"). A function
entrypoint's `ctx.loop` primes its first step; a script's loop is its own.

So, in a script's process: the first attempt records each DDP's rebuilt layout (rank 0, in
RUN_DIR/ddp/, once it was rebuilt and checked against DDP's own account of it), and a later
attempt builds that DDP directly in the recorded layout; DDP's own rebuild after the first backward
then finds the same order and changes nothing. The record is used only for a DDP whose parameters
have the recorded shapes, built as the same one in order (the first, the second, ...). A layout
is PyTorch's own, so the all-reduce overlaps the backward as it does without slurmddp. A DDP that
finds unused parameters never rebuilds and is left alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurmddp.rundir.ddp import BucketLayout


def install(run_dir: Path, rank: int) -> None:
    """Patch DistributedDataParallel in this process (the script's) as the module doc says."""
    import torch.distributed
    from torch.nn.parallel import DistributedDataParallel

    # What DDP calls, as torch.distributed's attribute, to lay out its first buckets (private).
    dist: Any = torch.distributed
    assign = dist._compute_bucket_assignment_by_size
    original_init = DistributedDataParallel.__init__
    numbers = itertools.count()

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        number = next(numbers)
        recorded = BucketLayout.read(run_dir, number)
        seen: dict[str, Any] = {}

        def initial(tensors: Sequence[Any], limits: Sequence[int], *rest: Any) -> Any:
            seen["tensors"], seen["sparse"] = list(tensors), list(rest[0]) if rest else []
            if recorded is not None and recorded.shapes == _shapes(tensors):
                seen["replayed"] = True
                # DDP reverses the buckets it is given (to approximate the gradients' order).
                return list(reversed(recorded.buckets)), list(reversed(recorded.limits))
            return assign(tensors, limits, *rest)

        dist._compute_bucket_assignment_by_size = initial
        try:
            original_init(self, *args, **kwargs)
        finally:
            dist._compute_bucket_assignment_by_size = assign
        if rank == 0 and "tensors" in seen and not seen.get("replayed") and not self.find_unused_parameters:
            _record_rebuilt(self, seen["tensors"], seen["sparse"], run_dir, number, assign)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]


def _record_rebuilt(
    ddp: Any, params: list[Any], sparse: list[bool], run_dir: Path, number: int, assign: Any
) -> None:
    """Note the order of the first backward's gradients; at the next forward, once DDP rebuilt its
    buckets, write the layout that order gives, if it is the one DDP reports."""
    order: list[int] = []
    hooks = [
        param.register_post_accumulate_grad_hook(lambda _, index=index: order.append(index))
        for index, param in enumerate(params)
    ]
    forward = ddp.forward

    def watching(*args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        data = ddp._get_ddp_logging_data()
        if not data.get("has_rebuilt_buckets"):
            return output
        for hook in hooks:
            hook.remove()
        del ddp.forward
        ready = list(dict.fromkeys(order))
        limits = [ddp._bucket_config.first_bucket_bytes_cap, ddp.bucket_bytes_cap]
        in_order = [params[i] for i in ready]
        buckets, per_bucket = assign(in_order, limits, [sparse[i] for i in ready] if sparse else [], ready)
        # What DDP itself reports of its rebuild, in the same words: the record is taken only
        # where this computation reproduced it (another torch may rebuild by other rules).
        indices = " ".join(str(i) for bucket in buckets for i in bucket)
        sizes = " ".join(str(sum(_bytes(params[i]) for i in bucket)) for bucket in buckets)
        reported = (data.get("rebuilt_per_bucket_param_indices"), data.get("rebuilt_bucket_sizes"))
        if len(ready) == len(params) and (indices, sizes) == reported:
            BucketLayout(_shapes(params), buckets, per_bucket).write(run_dir, number)
        return output

    ddp.forward = watching


def _bytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


def _shapes(tensors: Sequence[Any]) -> list[list[int]]:
    return [list(tensor.shape) for tensor in tensors]
