"""`submit --wait`'s progress line: built from progress.json and metrics.jsonl (pure), the speed
across attempts, the metrics file read incrementally through rewrites, and `follow` against a fake
job in a temp run directory, as plain lines off a terminal and as a rich live line on one."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from slurmddp.job.records import AttemptId, LoopProgress, Progress
from slurmddp.manage import follow as follow_module
from slurmddp.manage.follow import LatestMetrics, StepRate, follow, format_metrics, progress_line
from slurmddp.submit.submitter import Submission


def loop_progress(step: int, restart: int = 0, **position: int | None) -> Progress:
    fields = {"total_steps": None, "epoch": None, "epochs": None, **position}
    loop = LoopProgress(fields["total_steps"], fields["epoch"], fields["epochs"], 0.0, None)
    return Progress(step, AttemptId("5", restart), 1.0, loop)


def test_the_line_says_step_speed_eta_epoch_attempt_and_metrics() -> None:
    # The loop counts epochs from 0; the line, from 1.
    progress = loop_progress(1200, 1, total_steps=5000, epoch=2, epochs=10)
    metrics = {"step": 1200, "time": 1.0, "loss": 0.412345, "val_acc": 0.95}
    assert progress_line(progress, metrics, 40.0) == (
        "step 1200/5000 (24%)  40 steps/s  ETA 0:01:35  epoch 3/10  attempt 2  loss=0.4123 val_acc=0.9500"
    )


def test_a_run_without_total_epochs_or_metrics_shows_what_it_knows(tmp_path: Path) -> None:
    # progress.json as rank 0 wrote it before total_steps and epochs were added.
    (tmp_path / "progress.json").write_text(
        '{"step": 7, "time": 1.0, "last_save_s": 0.0, "job_id": "5", "restart_count": 0}'
    )
    old = Progress.read(tmp_path)
    assert old is not None and old.loop is not None and old.loop.last_save_s == 0.0
    assert progress_line(old, {}, None) == "step 7  ? steps/s  ETA ?  attempt 1"
    assert progress_line(old, {}, 2.5) == "step 7  2.5 steps/s  ETA ?  attempt 1"
    # A loop without `data` has no epochs.
    no_epochs = loop_progress(7, total_steps=10, epoch=0)
    assert progress_line(no_epochs, {}, None) == "step 7/10 (70%)  ? steps/s  ETA ?  attempt 1"


def test_eta_counts_hours_past_a_day_and_speed_keeps_three_digits() -> None:
    progress = loop_progress(0, total_steps=1_000_000)
    assert "10 steps/s  ETA 27:46:40" in progress_line(progress, {}, 10.0)
    assert "12346 steps/s  ETA 0:01:21" in progress_line(progress, {}, 12345.6)
    assert "0.00123 steps/s" in progress_line(progress, {}, 0.00123)
    assert "ETA ?" in progress_line(progress, {}, 0.0)
    # A record past the total (a loop that ran on) is not an ETA in the past.
    assert "ETA 0:00:00" in progress_line(dataclasses.replace(progress, step=1_000_001), {}, 10.0)


def test_metrics_are_the_first_four_numbers_to_four_digits() -> None:
    numbers = {"loss": 1234.6, "acc": 1, "note": "x", "ok": True, "lr": 3e-05, "a": 2, "b": 3}
    record = {"step": 3, "time": 9.0, **numbers}
    assert format_metrics(record) == "loss=1235 acc=1.000 lr=3.000e-05 a=2.000"
    assert format_metrics({"step": 1, "time": 2.0}) == ""


def test_speed_is_smoothed_within_an_attempt_and_starts_over_with_the_next() -> None:
    rate = StepRate()
    assert rate.update(Progress(0, AttemptId("5", 0), 100.0)) is None
    assert rate.update(Progress(20, AttemptId("5", 0), 102.0)) == pytest.approx(10.0)
    # The same record read again (rank 0 has not written since) changes nothing.
    assert rate.update(Progress(20, AttemptId("5", 0), 102.0)) == pytest.approx(10.0)
    assert rate.update(Progress(60, AttemptId("5", 0), 104.0)) == pytest.approx(13.0)
    # The requeued attempt resumes at its checkpoint, behind the last record.
    assert rate.update(Progress(40, AttemptId("5", 1), 300.0)) is None
    assert rate.update(Progress(44, AttemptId("5", 1), 302.0)) == pytest.approx(2.0)
    # Old runs' records lack restart_count (read as 0); a step going back is a new attempt all the same.
    assert rate.update(Progress(10, AttemptId("5", 0), 400.0)) is None


def test_latest_metrics_reads_on_from_where_it_stopped_and_through_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    latest = LatestMetrics(path)
    assert latest.read() == {}
    lines = [json.dumps({"step": s, "time": 0.0, "loss": 1 / (s + 1)}) for s in range(100)]
    path.write_text("\n".join(lines) + "\n")
    assert latest.read()["step"] == 99
    with path.open("a") as handle:
        handle.write(lines[0][:10])  # a record still being written
    assert latest.read()["step"] == 99
    with path.open("a") as handle:
        handle.write(lines[0][10:] + "\n")
    assert latest.read()["step"] == 0
    # A metric logged in its own record (validation, once an epoch) joins the others.
    with path.open("a") as handle:
        handle.write(json.dumps({"step": 0, "time": 0.0, "val_acc": 0.5}) + "\n")
    assert latest.read() == {"step": 0, "time": 0.0, "loss": 1.0, "val_acc": 0.5}

    # A resumed attempt drops the records past its checkpoint: the file, cut short in place...
    with path.open("r+") as handle:
        handle.truncate(len("\n".join(lines[:40])) + 1)
    assert latest.read() == {"step": 39, "time": 0.0, "loss": 1 / 40}
    # ...or replaced by a rename, even by one that already grew past where the reader was.
    replacement = tmp_path / "new.jsonl"
    replacement.write_text("\n".join(lines[:30] + lines[:90]) + "\n")
    os.replace(replacement, path)
    assert latest.read()["step"] == 89
    path.write_text("")
    assert latest.read() == {}


@dataclass
class FakeJob:
    """What follow asks of a submitit LocalJob."""

    finished: threading.Event = field(default_factory=threading.Event)

    def done(self) -> bool:
        return self.finished.is_set()


@dataclass
class FakePlan:
    run_dir: Path
    folder: Path
    executor: str = "local"
    world_size: int = 1


@dataclass
class FakeSubmission:
    plan: FakePlan
    job: FakeJob
    job_id: str = "77"

    def log_path(self, task: int, stream: str = "out") -> Path:
        return self.plan.folder / f"{self.job_id}_{task}_log.{stream}"


def run_fake_job(sub: FakeSubmission, total: int = 30, every_s: float = 0.03) -> None:
    """Rank 0 of a run requeued at step 20 that resumes from its checkpoint at step 16."""
    run_dir = sub.plan.run_dir
    metrics = run_dir / "metrics.jsonl"
    with sub.log_path(0).open("a") as log:
        log.write("[bold]hello[/bold] from the training code\n")
    steps = [(0, s) for s in range(0, 21)] + [(1, s) for s in range(16, total + 1)]
    for restart_count, step in steps:
        if (restart_count, step) == (1, 16):
            kept = metrics.read_text().splitlines()[:17]
            metrics.write_text("\n".join(kept) + "\n")
        with metrics.open("a") as handle:
            handle.write(json.dumps({"step": step, "time": time.time(), "loss": 1 / (step + 1)}) + "\n")
        position = LoopProgress(total_steps=total, epoch=0, epochs=1, last_save_s=0.0, global_batch=None)
        Progress(step, AttemptId(sub.job_id, restart_count), time.time(), position).write(run_dir)
        time.sleep(every_s)
    with (sub.plan.folder / f"{sub.job_id}_0_result.pkl").open("wb") as handle:
        pickle.dump(("success", None), handle)
    sub.job.finished.set()


def follow_fake_job(tmp_path: Path) -> tuple[str, str]:
    """Follow a fake job to its end; return follow's final state and what it wrote."""
    (tmp_path / "logs").mkdir()
    sub = FakeSubmission(FakePlan(run_dir=tmp_path, folder=tmp_path / "logs"), FakeJob())
    job = threading.Thread(target=run_fake_job, args=(sub,))
    job.start()
    out = io.StringIO()
    try:
        final = follow(cast(Submission, sub), out, poll_s=0.01)
    finally:
        job.join()
    return final, out.getvalue()


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the output is a wide terminal, as rich decides it."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


def progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("slurmddp: step ")]


def test_off_a_terminal_progress_comes_as_plain_lines_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, not_a_terminal: None
) -> None:
    monkeypatch.setattr(follow_module, "PLAIN_EVERY_S", 0.25)
    final, text = follow_fake_job(tmp_path)
    assert final == "COMPLETED"
    assert "\x1b" not in text
    assert "  [rank 0] [bold]hello[/bold] from the training code" in text
    assert "slurmddp: job 77 RUNNING" in text
    assert text.splitlines()[-1].startswith("slurmddp: job 77 ended COMPLETED")
    shown = progress_lines(text)
    # 51 progress records ~30 ms apart, each a new line: throttled to one every 0.25 s, and the last.
    assert 2 <= len(shown) <= 15, text
    assert shown[0].startswith("slurmddp: step ") and "attempt 1" in shown[0]
    assert shown[-1].startswith("slurmddp: step 30/30 (100%)")
    assert shown[-1].endswith("ETA 0:00:00  epoch 1/1  attempt 2  loss=0.03226")


def test_on_a_terminal_progress_is_one_line_redrawn_below_the_output(tmp_path: Path, terminal: None) -> None:
    final, text = follow_fake_job(tmp_path)
    assert final == "COMPLETED"
    # rich moves the cursor up over the line to redraw it; rank 0's text is not read as markup.
    assert "\x1b[1A" in text or "\x1b[2K" in text
    assert "  [rank 0] [bold]hello[/bold] from the training code" in text
    assert "slurmddp: job 77 RUNNING" in text
    assert "slurmddp: step 30/30 (100%)" in text and "attempt 2" in text
    # The line stays once the job ended; the verdict comes below it (after rich shows the cursor again).
    assert "slurmddp: job 77 ended COMPLETED (" in text.splitlines()[-1]
