"""slurmddp's Lightning callback on 3 local ranks (gloo): a run stopped mid-epoch at a random step,
then at two epoch ends in a row, ends on the uninterrupted run's parameters, bit for bit, with every
optimizer step made once (two stops at random steps under Slurm: test_frameworks_cluster.py); a
SIGTERM-only stop ends cleanly (Lightning's own handler would broadcast inside the handler); and
`auto()` gives the same run without the line in the Trainer."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import ROOT, only_run, rank_pids

SCRIPT = ROOT / "examples" / "frameworks" / "lightning_train.py"
STEPS = 60
SLOW = ("--sleep", "0.1")  # a stop sent at a random step lands well before the run ends
RANKS = 3  # with two, a + b == b + a and a changed summation order would go unseen
BATCHES_PER_EPOCH = 600 // RANKS // 8


def experiment(tmp: Path, *flags: str, steps: int = STEPS) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "lightning_train.py").write_text(SCRIPT.read_text())
    path = tmp / "exp.yaml"
    path.write_text(
        f"entrypoint: lightning_train.py --steps {steps} {' '.join(flags)}\n"
        "executor: local\n"
        f"resources: {{nodes: 1, tasks_per_node: {RANKS}, time: '00:10:00'}}\n"
    )
    return path


def submit(
    tmp: Path, *flags: str, steps: int = STEPS, overrides: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    exp = experiment(tmp, *flags, steps=steps)
    return subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(exp), f"output_dir={tmp / 'runs'}", *overrides],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def finish(proc: subprocess.Popen[str], tmp: Path, timeout: float = 600) -> Path:
    # A bound on a hang, not on speed: in a rehearsal at load 20 the reference's 3 ranks took 391 s
    # from their start to the first step (6 s of training after it), past the 300 s it had.
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return only_run(tmp / "runs")


def steps_of(run: Path, rank: int) -> list[int]:
    path = run / "steps" / f"rank-{rank}.txt"
    try:
        return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def last_step(tmp: Path) -> int:
    runs = list((tmp / "runs").glob("*/*/manifest.json"))
    return max(steps_of(runs[0].parent, 0), default=0) if runs else 0


def rank0_log(run: Path) -> str:
    """Rank 0's stdout and stderr (slurmddp's lines go to stderr), every attempt's."""
    return "".join(
        p.read_text() for p in sorted((run / "logs").glob("*_0_log.*")) if p.suffix in (".out", ".err")
    )


def resumes(tmp: Path) -> int:
    return sum(
        rank0_log(run.parent).count("slurmddp: resuming from")
        for run in (tmp / "runs").glob("*/*/manifest.json")
    )


def stop_at(proc: subprocess.Popen[str], tmp: Path, thresholds: list[int], signum: int) -> list[float]:
    """Send `signum` to every rank once rank 0 made each threshold's step; the seconds from each
    signal to the ranks' saved checkpoint."""
    took = []
    for attempt, threshold in enumerate(thresholds):
        # A stop, its save and the resumed attempt's start took over 240 s once beside a CI run.
        deadline = time.monotonic() + 480
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


def digest(run: Path, steps: int = STEPS) -> str:
    final: dict[str, object] = json.loads((run / "final.json").read_text())
    assert final["global_step"] == steps
    return str(final["sha256"])


def assert_every_step_once(run: Path, steps: int = STEPS) -> None:
    for rank in range(RANKS):
        counts = Counter(steps_of(run, rank))
        assert [s for s, n in counts.items() if n > 1] == [], f"rank {rank} redid steps"
        assert sorted(counts) == list(range(1, steps + 1)), f"rank {rank} is missing steps"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("reference")
    return digest(finish(submit(tmp), tmp))


def test_stopped_mid_epoch_then_at_two_epoch_ends_in_a_row_it_ends_on_the_uninterrupted_run(
    tmp_path: Path, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run, four attempts. SIGUSR2 sent to every rank at a step drawn at random in the first
    epoch (25 batches an epoch) stops them mid-epoch; then USR2 raised in every rank after steps
    24 and 49 stops them after steps 25 and 50, each its epoch's last (every step reads the stop:
    SLURMDDP_STOP_READ_EVERY=1). Lightning 2.6.6 did not count the epoch that a resume at an
    epoch's end starts, so the second resume gave the samplers the epoch before. The run ends on
    the uninterrupted run's parameters, bit for bit, with every optimizer step made once."""
    monkeypatch.setenv("SLURMDDP_STOP_READ_EVERY", "1")
    first = random.randrange(5, 20)
    proc = submit(tmp_path, *SLOW, "--signal-at", "24", "49")
    stop_at(proc, tmp_path, [first], signal.SIGUSR2)
    run = finish(proc, tmp_path)
    log = rank0_log(run)
    stopped = [int(step) for step in re.findall(r"slurmddp: saved \S*/step-(\d{8})", log)]
    assert len(stopped) == 3 and stopped[0] % BATCHES_PER_EPOCH and stopped[1:] == [25, 50], (first, stopped)
    # The first attempt recorded its DDP's rebuilt bucket layout, which the resumed ones were built
    # in (ddp.resume_buckets): what makes their first steps sum as the uninterrupted run did.
    assert (run / "ddp" / "0.json").is_file(), sorted(p.name for p in run.iterdir())
    assert digest(run) == reference, (first, stopped)
    assert_every_step_once(run)
    # One TensorBoard run, continued by every attempt (the callback keeps version_0).
    assert sorted(p.name for p in (run / "lightning_logs").iterdir()) == ["version_0"]
    assert len(list((run / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))) >= 2


def test_a_sigterm_only_stop_of_a_script_without_the_line_ends_cleanly_and_soon(
    tmp_path: Path, reference: str
) -> None:
    """`integrations: auto` in the experiment: the script, without the callback, gets it from
    slurmddp's import hook (job/script/autoload.py) once Lightning's Trainer module loads; and the stop
    comes as SIGTERM alone, which Lightning handles itself otherwise."""
    proc = submit(tmp_path, "--no-callback", *SLOW, overrides=("integrations=auto",))
    took = stop_at(proc, tmp_path, [random.randrange(8, 40)], signal.SIGTERM)
    # Lightning's own handler would broadcast inside the handler (a 300 s hang once); the ranks
    # stop at the next agreed step and have saved it within seconds.
    assert took[0] < 30, took
    run = finish(proc, tmp_path)
    assert "Received SIGTERM" not in rank0_log(run)
    assert digest(run) == reference
    assert_every_step_once(run)


def test_with_accumulation_a_stop_mid_epoch_and_one_at_its_end_resume_exactly(tmp_path: Path) -> None:
    # 25 batches an epoch, 2 a step: the 13th step ends the epoch on one batch. USR2 raised in every
    # rank after steps 5 and 12 stops them after steps 6 (mid-epoch) and 13 (the epoch's end).
    reference = submit(tmp_path / "reference", "--accumulate", "2", steps=30)
    proc = submit(tmp_path / "stopped", "--accumulate", "2", "--signal-at", "5", "12", steps=30)
    run = finish(proc, tmp_path / "stopped")
    log = rank0_log(run)
    assert "lightning_checkpoints/step-00000006" in log and "lightning_checkpoints/step-00000013" in log
    assert digest(run, 30) == digest(finish(reference, tmp_path / "reference"), 30)
    assert_every_step_once(run, 30)


# -- in this process: no ranks, no job (should_stop() is False) ------------------------------------


def write_checkpoint(root: Path, step: int, world_size: int = 3) -> Path:
    """A checkpoint as the callback writes one: lightning.ckpt, rank files, markers last."""
    from slurmddp.files import write_json
    from slurmddp.integrations.lightning import LIGHTNING_FILE

    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    for rank in range(world_size):
        names = [f"rank-{rank:05d}.pt", *([LIGHTNING_FILE] if rank == 0 else [])]
        files = {}
        for name in names:
            data = f"{name} of step {step}".encode()
            (path / name).write_bytes(data)
            files[name] = {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}
        marker = {"step": step, "rank": rank, "world_size": world_size, "attempt": "a1", "files": files}
        write_json(path / f"rank-{rank:05d}.done", marker)
    return path


def test_the_newest_complete_checkpoint_is_chosen_skipping_incomplete_and_damaged_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmddp.integrations.lightning import LIGHTNING_FILE, newest_complete

    complete = write_checkpoint(tmp_path, 10)
    (write_checkpoint(tmp_path, 20) / "rank-00002.done").unlink()  # rank 2 killed while saving
    damaged = write_checkpoint(tmp_path, 30)
    ckpt = damaged / LIGHTNING_FILE
    ckpt.write_bytes(bytes(reversed(ckpt.read_bytes())))  # same size, other bytes
    mixed = write_checkpoint(tmp_path, 40)
    marker = json.loads((mixed / "rank-00001.done").read_text())
    (mixed / "rank-00001.done").write_text(json.dumps({**marker, "attempt": "a0"}))
    assert newest_complete(tmp_path, 3) == complete
    skipped = capsys.readouterr().err
    assert "step-00000040: its markers come from different attempts" in skipped
    assert "step-00000030: lightning.ckpt has CRC32" in skipped
    assert "step-00000020: no completion marker from rank 2" in skipped
    assert newest_complete(tmp_path, 4) is None  # written by 3 ranks: a 4th rank's marker is missing
    assert newest_complete(tmp_path / "nothing", 3) is None


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SeesHandlers(pl.Callback):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_batch_start(self, *_: Any) -> None:
        self.seen.append(signal.getsignal(signal.SIGTERM))


def fit(tmp_path: Path, callbacks: list[pl.Callback] | None) -> pl.Trainer:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Tiny(), data)
    return trainer


def test_lightnings_sigterm_handler_never_runs_during_training(tmp_path: Path) -> None:
    from slurmddp.integrations.lightning import SlurmddpCallback

    def recording(signum: int, frame: Any) -> None:  # slurmddp's own only records the signal
        pass

    before = signal.signal(signal.SIGTERM, recording)
    try:
        sees = SeesHandlers()
        fit(tmp_path, [SlurmddpCallback(), sees])
        assert sees.seen == [recording] * 3
        without = SeesHandlers()
        fit(tmp_path, [without])
        assert without.seen and all(handler is not recording for handler in without.seen)  # Lightning's
    finally:
        signal.signal(signal.SIGTERM, before)


def test_auto_adds_the_callback_to_every_trainer_built_afterwards_once(tmp_path: Path) -> None:
    from slurmddp.integrations import lightning as integration

    original = pl.Trainer.__init__
    try:
        integration.auto()
        integration.auto()  # a second call changes nothing
        for callbacks in (None, [SeesHandlers()], [integration.SlurmddpCallback(dirpath=tmp_path)]):
            trainer = fit(tmp_path, callbacks)
            ours = [cb for cb in trainer.callbacks if isinstance(cb, integration.SlurmddpCallback)]
            assert len(ours) == 1
    finally:
        pl.Trainer.__init__ = original  # type: ignore[method-assign]
