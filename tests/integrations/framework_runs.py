"""Local runs of the framework examples (examples/frameworks/), stopped at steps a test draws: the
steps each rank made (RUN_DIR/steps-RANK.log, one line per optimizer step) and the final digest
(RUN_DIR/final.json) tell whether a stop lost or redid work and whether the run ended exactly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, only_run, rank_pids

FRAMEWORKS = ROOT / "examples" / "frameworks"


def submit(out: Path, experiment: str, *overrides: str) -> subprocess.Popen[str]:
    """`python -m slurmddp submit` a framework example locally (it waits for the run's end)."""
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(FRAMEWORKS / experiment),
            "executor=local",
            f"output_dir={out}",
            *overrides,
        ],
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def steps_done(run: Path, rank: int = 0) -> list[int]:
    """The steps rank `rank` made, in order (each line of its log: the step, then its time)."""
    try:
        return [int(line.split()[0]) for line in (run / f"steps-{rank}.log").read_text().splitlines()]
    except FileNotFoundError:
        return []


def stop_at(proc: subprocess.Popen[str], out: Path, step: int, signum: int = signal.SIGUSR2) -> None:
    """Send the stop signal to every rank once rank 0 has made `step` steps in all."""
    deadline = time.monotonic() + 240
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended before step {step}: {proc.stdout.read() if proc.stdout else ''}"
            )
        assert time.monotonic() < deadline, f"no step {step} after 240 s"
        runs = list(out.glob("*/*/manifest.json"))
        if runs and len(steps_done(runs[0].parent)) >= step:
            break
        time.sleep(0.05)
    run = runs[0].parent
    for pid in rank_pids(run):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def finish(proc: subprocess.Popen[str], out: Path, timeout: float = 600) -> Path:
    stdout, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stdout
    return only_run(out)


def final(run: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((run / "final.json").read_text())
    return loaded


def assert_each_step_once(run: Path, ranks: int, total: int) -> None:
    """Every rank made steps 1..total, each exactly once across its attempts."""
    for rank in range(ranks):
        done = steps_done(run, rank)
        assert sorted(done) == list(range(1, total + 1)), (rank, [s for s in done if done.count(s) > 1][:5])


def assert_records_count_the_steps(run: Path, total: int) -> None:
    """attempts.jsonl: each attempt ended at the optimizer steps rank 0 had made in the run by then
    (a script's steps counted across its attempts, as `status` shows them), the last at `total`."""
    events = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    begins = [event["time"] for event in events if event["event"] == "begin"]
    times = [float(line.split()[-1]) for line in (run / "steps-0.log").read_text().splitlines()]
    made = [sum(at < begin for at in times) for begin in begins[1:]] + [len(times)]
    assert [event["step"] for event in events if event["event"] == "end"] == made
    assert made[-1] == total
