"""Local runs of examples/frameworks/transformers_train.py (3 gloo ranks), stopped at steps the
test draws, and what they leave: the final digest, each rank's optimizer steps, the stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import ROOT, rank_pids, run_dirs

SCRIPT = ROOT / "examples" / "frameworks" / "transformers_train.py"
RANKS = 3
STEPS = 60


@dataclass
class Run:
    """One submission: its output_dir (`out`), the Trainer's output_dir and the step records."""

    root: Path
    proc: subprocess.Popen[str]
    stops: list[int] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.root / "runs"

    @property
    def trainer_dir(self) -> Path:
        return self.root / "trainer"

    @property
    def steps_dir(self) -> Path:
        return self.root / "steps"

    @property
    def final(self) -> Path:
        return self.root / "final.json"

    def run_dir(self) -> Path | None:
        dirs = run_dirs(self.out)
        return dirs[0] if dirs else None

    def steps(self, rank: int = 0) -> list[int]:
        """The optimizer steps rank `rank` made, in order, over every attempt."""
        try:
            text = (self.steps_dir / f"rank-{rank}.txt").read_text()
        except OSError:
            return []
        # Each line: the step, then the time it ended.
        return [int(line.split()[0]) for line in text.splitlines() if line.strip()]

    def resumes(self) -> int:
        run = self.run_dir()
        if run is None:
            return 0
        logs = (run / "logs").glob("*_0_log.err")
        return sum(path.read_text(errors="replace").count("slurmddp: resuming from") for path in logs)

    def wait(self, timeout: float = 400) -> str:
        stdout, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, stdout
        return stdout

    def result(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.final.read_text())
        assert len(set(result["ranks"])) == 1, f"ranks ended with different parameters: {result}"
        return result

    def after_train(self) -> list[int]:
        """The global step of every attempt that ran the script's code after trainer.train()."""
        return [int(line) for line in (self.root / "after_train.txt").read_text().split()]


def submit(root: Path, *flags: str, steps: int = STEPS, settings: str = "") -> Run:
    """Submit the example locally with 3 ranks under `root` (the Trainer's output_dir, the step
    records and final.json too); `settings`: more lines of the experiment."""
    root.mkdir(parents=True, exist_ok=True)
    exp = root / "exp.yaml"
    entry = [
        str(SCRIPT),
        f"--max-steps={steps}",
        f"--output-dir={root / 'trainer'}",
        f"--record-steps={root / 'steps'}",
        f"--final={root / 'final.json'}",
        *flags,
    ]
    exp.write_text(
        f"entrypoint: {json.dumps(' '.join(entry))}\nexecutor: local\n"
        f"resources: {{nodes: 1, tasks_per_node: {RANKS}, time: '00:20:00'}}\n{settings}"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(exp), f"output_dir={root / 'runs'}"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Run(root, proc)


def preempt_at(
    run: Run, thresholds: list[int], timeout: float = 300, after_stop: Callable[[int], None] | None = None
) -> None:
    """For each threshold in turn: once the attempt running then has made that optimizer step,
    send every rank SIGUSR2 (what Slurm sends on preemption), wait for the stop's save, call
    `after_stop` with its step (before the next attempt looks for its resume point: it has yet to
    start its ranks and import torch), and wait for the next attempt to resume. Records the step
    each stop saved in `run.stops`."""
    for attempt, threshold in enumerate(thresholds):

        def alive(what: str, deadline: float = time.monotonic() + timeout) -> None:
            assert run.proc.poll() is None, f"the run ended {what}: {run.proc.communicate()[0]}"
            assert time.monotonic() < deadline, f"timed out {what} (thresholds {thresholds})"

        while not (run.resumes() == attempt and (run.steps() or [0])[-1] >= threshold):
            alive(f"before step {threshold}")
            time.sleep(0.02)
        run_dir = run.run_dir()
        assert run_dir is not None
        for pid in rank_pids(run_dir):
            os.kill(pid, signal.SIGUSR2)
        while len(saved := _saved(run_dir)) <= attempt:
            alive(f"before the save for the stop at {threshold}")
            time.sleep(0.02)
        run.stops.append(saved[attempt])
        if after_stop is not None:
            after_stop(saved[attempt])
        while run.resumes() == attempt:
            alive(f"before resuming after the stop at {threshold}")
            time.sleep(0.05)


def _saved(run_dir: Path) -> list[int]:
    """The step of each checkpoint saved for a stop, from rank 0's log."""
    logs = "".join(
        path.read_text(errors="replace") for path in sorted((run_dir / "logs").glob("*_0_log.err"))
    )
    return [
        int(part.split()[0])
        for part in logs.split("slurmddp: saved checkpoint-")[1:]
        if " for the stop" in part
    ]
