"""What `submit --wait` and `status` print: the live region at any width (nothing cut), the plain
lines off a terminal, the result block, one format for speeds and times, and the attempts and
elapsed time of a local run (which has no attempt records)."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from slurmddp.manage import display, numbers, report, runs, views
from slurmddp.manage.snapshot import Snapshot

METRICS = {"loss": 0.13532, "epoch": 7.0, "val_acc": 0.908333, "val_loss": 0.376894, "lr": 3e-05}


def running(**fields: object) -> Snapshot:
    base: dict[str, object] = {
        "state": "RUNNING",
        "elapsed_s": 12.0,
        "step": 65,
        "total_steps": 176,
        "epoch": 2,
        "epochs": 8,
        "attempt": 1,
        "rate": 58.64,
        "metrics": dict(METRICS),
    }
    return Snapshot(**{**base, **fields})  # type: ignore[arg-type]


def test_speeds_and_times_read_one_way() -> None:
    assert numbers.throughput(7251.3, "samples") == "7,251 samples/s"
    assert numbers.throughput(10894.0, "samples") == "10,894 samples/s"
    assert numbers.throughput(99.24, "steps") == "99.2 steps/s"
    assert numbers.rate(0.00123) == "0.00123"
    assert numbers.rate(float("nan")) == "?"
    assert numbers.duration(100000) == "27:46:40"
    assert numbers.duration(None) == "?"
    assert numbers.duration(-3) == "0:00:00"
    shown = [numbers.metric(v) for v in (0.908333, 1234.6, 3e-05, 7.0, 3)]
    assert shown == ["0.9083", "1235", "3.000e-05", "7", "3"]
    assert numbers.pace({"perf/samples_per_s": 10894.2, "perf/steps_per_s": 99.24}) == "10,894 samples/s"
    assert numbers.pace({"perf/steps_per_s": 99.24}) == "99.2 steps/s"


def test_the_plain_line_holds_everything_the_snapshot_says() -> None:
    assert display.plain_line(running()) == (
        "slurmddp: step 65/176 (36%)  58.6 steps/s  ETA 0:00:02  epoch 2 (0-7)  attempt 1  "
        "loss=0.1353  epoch=7  val_acc=0.9083  val_loss=0.3769  lr=3.000e-05"
    )
    unknown = running(total_steps=None, epoch=None, epochs=None, rate=None, metrics={})
    assert display.plain_line(unknown) == "slurmddp: step 65  ? steps/s  ETA ?  attempt 1"
    starting = running(step=None, starting="ranks started; joining the process group")
    assert display.plain_line(starting) == (
        "slurmddp: RUNNING 0:00:12  ranks started; joining the process group"
    )


def screen(snap: Snapshot, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(display.render(snap))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_the_live_region_cuts_nothing_at_any_width(width: int) -> None:
    lines = screen(running(), width)
    # No line reaches the last column (a full line would be redrawn as two by some terminals).
    assert all(len(line) < width for line in lines), lines
    assert "━" in lines[0] and lines[0].rstrip().endswith("65/176 (36%)")
    words = " ".join(lines).split()
    for item in display.detail_items(running()) + display.metric_items(running()):
        # Each item is whole on one line (not split between two).
        assert any(item in line for line in lines), (item, lines)
    assert "val_acc=0.9083" in words


def test_the_live_region_before_the_loop_says_what_the_job_does() -> None:
    phase = "process group up, preflight passed; your code is setting up"
    lines = screen(running(step=None, starting=phase), 40)
    assert "RUNNING 0:00:12" in lines[0]
    assert " ".join(" ".join(lines).split()).endswith("your code is setting up")
    assert all(len(line) <= 40 for line in lines)


def test_off_a_terminal_each_start_phase_is_said_once_and_progress_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    view = views.PlainView(out)
    phase = "ranks started; joining the process group"
    for elapsed in (1.0, 2.0):
        view.show(running(step=None, starting=phase, elapsed_s=elapsed))
    view.show(running(step=10))
    view.show(running(step=20))  # within PLAIN_EVERY_S: not written
    view.show(running(step=176), final=True)
    assert out.getvalue().splitlines() == [
        f"slurmddp: {phase}",
        display.plain_line(running(step=10)),
        display.plain_line(running(step=176)),
    ]


def test_the_result_block_is_a_line_per_row_and_the_next_commands() -> None:
    out = io.StringIO()
    display.print_block(
        out,
        [("metrics", "val_acc=0.9083"), ("run dir", "/runs/q/1")],
        [("python -m slurmddp status /runs/q/1", "its state")],
    )
    assert out.getvalue().splitlines() == [
        "  metrics: val_acc=0.9083",
        "  run dir: /runs/q/1",
        "next:",
        "  python -m slurmddp status /runs/q/1  # its state",
    ]


def local_run(tmp_path: Path, submitted: float, progress_attempt: int | None) -> Path:
    """A finished local run as submit leaves it: a manifest, rank 0's logs, no attempts.jsonl."""
    run = tmp_path / "run"
    logs = run / "logs"
    logs.mkdir(parents=True)
    manifest = {
        "executor": "local",
        "job_id": "4242",
        "logs": str(logs),
        "world_size": 1,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(submitted)),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "result.json").write_text("{}")
    for name in ("4242_0_log.out", "4242_0_log.err"):
        (logs / name).write_text("")
        os.utime(logs / name, (submitted + 95, submitted + 95))
    if progress_attempt is not None:
        progress = {"step": 3, "time": 1.0, "restart_count": progress_attempt}
        (run / "progress.json").write_text(json.dumps(progress))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "perf/samples_per_s": 10894.2}) + "\n")
    return run


def test_status_of_a_local_run_counts_its_attempt_and_its_time(tmp_path: Path) -> None:
    submitted = float(int(time.time()) - 1000)
    target = runs.load(local_run(tmp_path, submitted, progress_attempt=None))
    [row] = runs.rows(target)
    # Before: `attempts 0` and `0:00:00` for every local run.
    shown = (row.state, row.attempts, row.elapsed_s, row.throughput)
    assert shown == ("COMPLETED", 1, 95.0, "10,894 samples/s")
    table = report.status_table(target, [row], None)
    assert "COMPLETED  1         3     -       10,894 samples/s  0:01:35" in table, table


def test_a_local_run_restarted_counts_the_attempts_its_progress_saw(tmp_path: Path) -> None:
    target = runs.load(local_run(tmp_path, time.time() - 100, progress_attempt=1))
    assert runs.rows(target)[0].attempts == 2
