"""slurmddp's Lightning callback on 3 local ranks (gloo): a run preempted twice at random steps ends
on the uninterrupted run's parameters, bit for bit, with every optimizer step made once; a
SIGTERM-only stop ends cleanly (Lightning's own handler would broadcast inside the handler); and
`auto()` gives the same run without the line in the Trainer."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, only_run, rank_pids

SCRIPT = ROOT / "examples" / "frameworks" / "lightning_train.py"
STEPS = 90
SLOW = ("--sleep", "0.1")  # a stop sent at a random step lands well before the run ends
RANKS = 3  # with two, a + b == b + a and a changed summation order would go unseen
BATCHES_PER_EPOCH = 600 // RANKS // 8


def experiment(tmp: Path, *flags: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "lightning_train.py").write_text(SCRIPT.read_text())
    path = tmp / "exp.yaml"
    path.write_text(
        f"entrypoint: lightning_train.py --steps {STEPS} {' '.join(flags)}\n"
        "executor: local\n"
        f"resources: {{nodes: 1, tasks_per_node: {RANKS}, time: '00:10:00'}}\n"
    )
    return path


def submit(tmp: Path, *flags: str) -> subprocess.Popen[str]:
    exp = experiment(tmp, *flags)
    return subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(exp), f"output_dir={tmp / 'runs'}"],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def finish(proc: subprocess.Popen[str], tmp: Path, timeout: float = 300) -> Path:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return only_run(tmp / "runs")


def steps_of(run: Path, rank: int) -> list[int]:
    path = run / "steps" / f"rank-{rank}.txt"
    try:
        return [int(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def last_step(tmp: Path) -> int:
    runs = list((tmp / "runs").glob("*/*/manifest.json"))
    return max(steps_of(runs[0].parent, 0), default=0) if runs else 0


def rank0_log(run: Path) -> str:
    return "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))


def resumes(tmp: Path) -> int:
    return sum(
        p.read_text().count("slurmddp: resuming from") for p in (tmp / "runs").glob("*/*/logs/*_0_log.out")
    )


def stop_at(proc: subprocess.Popen[str], tmp: Path, thresholds: list[int], signum: int) -> list[float]:
    """Send `signum` to every rank once rank 0 made each threshold's step; the seconds from each
    signal to the ranks' saved checkpoint."""
    took = []
    for attempt, threshold in enumerate(thresholds):
        deadline = time.monotonic() + 240
        while not (resumes(tmp) == attempt and last_step(tmp) >= threshold):
            assert proc.poll() is None and time.monotonic() < deadline, f"no step {threshold} ({thresholds})"
            time.sleep(0.05)
        sent = time.monotonic()
        run = only_run(tmp / "runs")
        for pid in rank_pids(run):
            os.kill(pid, signum)
        while rank0_log(run).count("slurmddp: saved ") == attempt:
            assert proc.poll() is None and time.monotonic() < deadline, f"no save ({thresholds})"
            time.sleep(0.05)
        took.append(time.monotonic() - sent)
        while resumes(tmp) == attempt:
            assert proc.poll() is None and time.monotonic() < deadline, f"no resume ({thresholds})"
            time.sleep(0.05)
    return took


def digest(run: Path) -> str:
    final: dict[str, object] = json.loads((run / "final.json").read_text())
    assert final["global_step"] == STEPS
    return str(final["sha256"])


def assert_every_step_once(run: Path) -> None:
    for rank in range(RANKS):
        counts = Counter(steps_of(run, rank))
        assert [s for s, n in counts.items() if n > 1] == [], f"rank {rank} redid steps"
        assert sorted(counts) == list(range(1, STEPS + 1)), f"rank {rank} is missing steps"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("reference")
    return digest(finish(submit(tmp), tmp))


def test_preempted_twice_at_random_steps_it_ends_on_the_uninterrupted_run_bit_for_bit(
    tmp_path: Path, reference: str
) -> None:
    # One stop mid-epoch for sure; the other anywhere (an epoch ends every 25 steps).
    first = random.randrange(5, 35)
    thresholds = [first, random.randrange(first + 12, STEPS - 20)]
    proc = submit(tmp_path, *SLOW)
    stop_at(proc, tmp_path, thresholds, signal.SIGUSR2)
    run = finish(proc, tmp_path)
    log = rank0_log(run)
    stopped = [int(part.split()[0]) for part in log.split("stopped at step ")[1:]]
    assert len(stopped) == 2, (thresholds, log[-3000:])
    assert any(s % BATCHES_PER_EPOCH for s in stopped), stopped
    assert digest(run) == reference, (thresholds, stopped)
    assert_every_step_once(run)


def test_a_sigterm_only_stop_ends_cleanly_and_soon(tmp_path: Path, reference: str) -> None:
    proc = submit(tmp_path, *SLOW)
    took = stop_at(proc, tmp_path, [random.randrange(8, 50)], signal.SIGTERM)
    # Lightning's own handler would broadcast inside the handler (a 300 s hang once); the ranks
    # stop at the next agreed step and have saved it within seconds.
    assert took[0] < 30, took
    run = finish(proc, tmp_path)
    assert "Received SIGTERM" not in rank0_log(run)
    assert digest(run) == reference
    assert_every_step_once(run)


def test_auto_gives_the_same_run_without_the_line(tmp_path: Path, reference: str) -> None:
    proc = submit(tmp_path, "--auto", *SLOW)
    stop_at(proc, tmp_path, [random.randrange(8, 60)], signal.SIGUSR2)
    run = finish(proc, tmp_path)
    assert digest(run) == reference
    assert_every_step_once(run)


def test_with_accumulation_a_stop_mid_epoch_and_one_at_its_end_resume_exactly(tmp_path: Path) -> None:
    # 25 batches an epoch, 2 a step: the 13th step ends the epoch on one batch. USR2 raised in every
    # rank after steps 5 and 12 stops them after steps 6 (mid-epoch) and 13 (the epoch's end).
    reference = submit(tmp_path / "reference", "--accumulate", "2")
    proc = submit(tmp_path / "stopped", "--accumulate", "2", "--signal-at", "5", "12")
    run = finish(proc, tmp_path / "stopped")
    log = rank0_log(run)
    assert "lightning_checkpoints/step-00000006" in log and "lightning_checkpoints/step-00000013" in log
    assert digest(run) == digest(finish(reference, tmp_path / "reference"))
    assert_every_step_once(run)
