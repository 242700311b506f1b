"""What a restart in a new process pays that a fork of a resident process would not: N processes
(4: the lab's 2 x 2 ranks, here on one machine) from their start to the end of their first
optimizer step, started anew (`python -c`: import torch, build a model, the first step, whose
optimizer imports torch._dynamo) against forked from one parent that holds torch and
torch._dynamo imported and has run no tensor operation.

No Slurm, no process group: the part of a restarted attempt's start that a launcher resident on
each node, forking the ranks, would take away. Alternates the two, prints each round and the ratio
of medians.
Usage: python benchmarks/fork_start.py [--rounds 5] [--processes 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

FIRST_STEP = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
torch.nn.functional.cross_entropy(model(torch.randn(16, 64)), torch.randint(0, 10, (16,))).backward()
optimizer.step()
"""
"""The quickstart's model and optimizer (examples/quickstart_train.py), one step of 16 samples."""


def fresh(processes: int) -> float:
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", FIRST_STEP]) for _ in range(processes)]
    if any(child.wait() for child in children):
        raise SystemExit("a fresh process failed")
    return time.perf_counter() - started


def forked(processes: int) -> float:
    """In a parent of its own, so that this process stays without torch for `fresh`."""
    read, write = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.close(read)
        import torch._dynamo  # noqa: F401  (what the resident parent holds: imports only)

        started = time.perf_counter()
        children = []
        for _ in range(processes):
            child = os.fork()
            if child == 0:
                exec(FIRST_STEP)
                os._exit(0)
            children.append(child)
        failed = any(os.waitpid(child, 0)[1] for child in children)
        os.write(write, b"failed" if failed else f"{time.perf_counter() - started}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    os.waitpid(parent, 0)
    if text == "failed":
        raise SystemExit("a forked process failed")
    return float(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    anew, fork = [], []
    for round_ in range(args.rounds):
        anew.append(fresh(args.processes))
        fork.append(forked(args.processes))
        print(f"round {round_ + 1}: started anew {anew[-1]:.3f} s, forked {fork[-1]:.3f} s")
    anew_s, fork_s = statistics.median(anew), statistics.median(fork)
    print(f"median, {args.processes} processes to their first optimizer step: ", end="")
    print(f"started anew {anew_s:.3f} s, forked from a parent holding torch and torch._dynamo ", end="")
    print(f"{fork_s:.3f} s; ratio {fork_s / anew_s:.3f}")


if __name__ == "__main__":
    main()
