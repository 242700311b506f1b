"""Training functions that tests submit, written out as source: each test's own file beside its
experiment, since a rank imports its function by file and name."""

from __future__ import annotations

from pathlib import Path


def write_main(folder: Path, returns: str = "{}", name: str = "train.py") -> Path:
    """`folder/name` holding `def main(ctx)` that returns the Python expression `returns`: the
    least an entrypoint needs (`name:main`)."""
    path = folder / name
    path.write_text(f"def main(ctx):\n    return {returns}\n")
    return path


def linear_ddp_train(*, steps: int, at_step: int, rank: int, then: str, imports: str, returns: str) -> str:
    """Source of `train(ctx)`: a seeded Linear(8, 1) in DDP trained for `steps` steps of ctx.loop,
    in which rank `rank` runs the statement `then` at step `at_step` (`imports` above it). The
    statement is on line 13, the line a stack or a hang report names."""
    return f"""
{imports}
import torch
from slurmddp import RunContext

def train(ctx: RunContext) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in ctx.loop({steps}, model=model, optimizer=optimizer):
        if step == {at_step} and ctx.rank == {rank}:
            {then}
        optimizer.zero_grad()
        ddp(torch.ones(4, 8)).sum().backward()
        optimizer.step()
    return {returns}
"""
