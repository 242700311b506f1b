"""`submit --wait` of the quickstart in a real pseudo-terminal (tmux), as a user sees it: the bar
with step/total, the final metrics whole at 60 and 120 columns, the result block; a resize that
leaves no stale fragment; and a Ctrl-C that cancels the run without a traceback, exit 130,
`status` CANCELLED. Each test has its own
tmux server (a socket in its tmp_path) and kills only that one."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import QUICKSTART, only_run

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="the terminal tests drive tmux, not installed"),
]
# Two ranks on one node, no loader workers: a few seconds of training after the start.
SHORT = (
    "executor=local",
    "resources.nodes=1",
    "resources.tasks_per_node=2",
    "train.workers=0",
)


class Pane:
    """A tmux pane of a server of this test's own, running one shell command."""

    def __init__(self, tmp_path: Path, width: int) -> None:
        self.socket = tmp_path / "tmux.sock"
        self.status = tmp_path / "exit_status"
        self.width = width

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-S", str(self.socket), *args], check=True, capture_output=True, text=True
        ).stdout

    def start(self, command: list[str]) -> None:
        script = self.socket.parent / "run.sh"
        # COLUMNS and LINES, where the test's environment has them, would fix rich's idea of the
        # size: the pane's own is what is tested.
        script.write_text(f"unset COLUMNS LINES\n{shlex.join(command)}\necho $? > {self.status}\nsleep 600\n")
        # The server, and so the pane, inherits this test's environment (its own XDG_STATE_HOME).
        self.tmux("new-session", "-d", "-x", str(self.width), "-y", "50", f"bash {script}")
        self.tmux("set-option", "-g", "history-limit", "5000")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-S", "-500")

    def wait_for(self, what: str, check: Callable[[str], object], timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if check(text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"{what} did not come within {timeout:.0f} s; the screen:\n{self.screen()}")

    def exit_status(self, timeout: float = 240.0) -> int:
        self.wait_for(
            "the command's end", lambda _: self.status.is_file() and self.status.read_text().strip(), timeout
        )
        return int(self.status.read_text())

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True)


@pytest.fixture
def pane_at(tmp_path: Path) -> Iterator[Callable[[int], Pane]]:
    made: list[Pane] = []

    def make(width: int) -> Pane:
        made.append(Pane(tmp_path, width))
        return made[-1]

    yield make
    for pane in made:
        pane.kill()


def submit_command(out: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "slurmddp",
        "submit",
        str(QUICKSTART),
        "--wait",
        *SHORT,
        f"output_dir={out}",
        *overrides,
    ]


@pytest.mark.parametrize("width", [60, 120])
def test_the_screen_shows_the_bar_the_final_metrics_whole_and_the_result_block(
    tmp_path: Path, pane_at: Callable[[int], Pane], width: int
) -> None:
    pane = pane_at(width)
    pane.start(submit_command(tmp_path / "runs", "train.epochs=2"))
    assert pane.exit_status() == 0, pane.screen()
    time.sleep(0.5)
    lines = pane.screen().splitlines()
    text = "\n".join(lines)
    assert "Traceback" not in text
    bar = [line for line in lines if "━" in line]
    assert bar and bar[-1].rstrip().endswith("44/44 (100%)"), text
    assert any("attempt 1" in line and "epoch 1 (0-1)" in line for line in lines), text
    # The final validation accuracy, whole on one line, in the live region and in the block.
    accuracy = [line for line in lines if re.search(r"val_acc=0\.\d{4}\b", line)]
    assert len(accuracy) == 2, text
    assert "ended COMPLETED after 0:0" in text
    assert any(line.startswith("  metrics:") for line in lines), text
    assert any(line.startswith("  time:") and "1 attempt" in line for line in lines), text
    assert "next:" in text and "python -m slurmddp status" in text and "python -m slurmddp results" in text
    result = only_run(tmp_path / "runs") / "result.json"
    assert json.loads(result.read_text())["result"]["val_acc"] > 0.5


def test_ctrl_c_cancels_the_run_and_a_resize_leaves_no_fragment(
    tmp_path: Path, pane_at: Callable[[int], Pane]
) -> None:
    pane = pane_at(80)
    out = tmp_path / "runs"
    pane.start(submit_command(out, "train.epochs=200"))
    pane.wait_for("the training loop", lambda text: "━" in text and "steps/s" in text)
    # A narrower terminal wraps the region's lines onto more rows: no fragment of it may stay.
    pane.tmux("resize-window", "-x", "45")
    time.sleep(1.5)
    pane.tmux("send-keys", "C-c")
    assert pane.exit_status() == 130, pane.screen()
    # The traceback of before came from submitit's controller after the shell's prompt: give it time.
    time.sleep(3)
    text = pane.screen()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "slurmddp: Ctrl-C: cancelling" in text and "ended CANCELLED" in text, text
    assert len([line for line in text.splitlines() if "━" in line]) == 1, text
    status = subprocess.run(
        [sys.executable, "-m", "slurmddp", "status", str(only_run(out)), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    [element] = json.loads(status.stdout)["elements"]
    assert element["state"] == "CANCELLED" and element["attempts"] == 1, element
