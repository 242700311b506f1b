"""Metrics reduced across ranks: sums of counts, the mean of a scalar, a gather of Python objects.

Each is a collective: every rank calls it, in the same order. Counts (integers) are summed as
int64, so `correct / total` over a sharded validation set is exactly what one process computes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist


def _number(value: Any) -> int | float:
    if isinstance(value, torch.Tensor):
        value = value.detach().item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number or a one-element tensor")
    return value


def reduce_sum(values: list[Any], device: torch.device) -> list[int | float]:
    """The sum over ranks of each value (numbers or one-element tensors); integers stay integers."""
    numbers = [_number(v) for v in values]
    integral = all(isinstance(n, int) for n in numbers)
    tensor = torch.tensor(numbers, dtype=torch.int64 if integral else torch.float64, device=device)
    tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return [int(x) if integral else float(x) for x in tensor.tolist()]


def reduce_mean(value: Any, device: torch.device) -> float:
    """The mean over ranks of one scalar (float64, so the mean of equal values is that value)."""
    (total,) = reduce_sum([float(_number(value))], device)
    return float(total) / tdist.get_world_size()


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (anything picklable), in rank order, on every rank."""
    gathered: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(gathered, obj)
    return gathered


def every_rank(problem: str | None) -> list[str | None]:
    """Each rank's `problem`, in rank order, on every rank (just this one's without a process group)."""
    if not tdist.is_initialized():
        return [problem]
    found: list[str | None] = gather(problem)
    return found


def first_problem(problem: str | None) -> str | None:
    """The lowest rank's problem, on every rank: what they all act on; None where no rank has one."""
    return next((found for found in every_rank(problem) if found is not None), None)
