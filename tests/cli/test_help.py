"""The help a user reads, --version, and shell completion as argcomplete's shell hook asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from slurmddp.cli.main import main, version
from slurmddp.defaults import VERSION

COMMANDS = [
    "submit",
    "dryrun",
    "config",
    "mpilaunch",
    "init",
    "scale",
    "doctor",
    "status",
    "logs",
    "interrupt",
    "cancel",
    "resubmit",
    "list",
    "results",
    "then",
]


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def test_the_top_level_help_gives_each_command_a_line_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    shown = help_of(capsys)
    listing = shown.split("\ncommands:\n")[1].splitlines()
    starts = [line.split()[0] for line in listing if not line.startswith("   ")]
    assert starts == COMMANDS
    assert ".;" not in shown
    assert "  init       Write a starter experiment and training function" in shown


def test_scale_help_prints_percent_signs_once(capsys: pytest.CaptureFixture[str]) -> None:
    shown = " ".join(help_of(capsys, "scale").split())
    assert "under 90% or exposed communication over 10% with" in shown
    assert "%%" not in shown


def test_interrupt_help_says_what_each_kind_stands_for(capsys: pytest.CaptureFixture[str]) -> None:
    shown = " ".join(help_of(capsys, "interrupt").split())
    assert "--preempt as Slurm preempting it" in shown and "requeue.max_preemptions" in shown
    assert "--timeout as its time limit drawing near" in shown and "requeue.max_timeouts" in shown


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"slurmddp {metadata.version('slurmddp')}\n"


def test_version_from_a_checkout_pip_never_installed_is_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version() == VERSION == "0.1.0"


def complete(line: str, tmp_path: Path) -> list[str]:
    """What argcomplete offers for `line` (the cursor at its end), asked the way its bash hook asks
    (register-python-argcomplete): _ARGCOMPLETE names the word the command line starts at,
    COMP_LINE/COMP_POINT the line and cursor, and the answer goes to a file instead of fd 8."""
    answer = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "COMP_TYPE": "9",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurmddp"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return answer.read_text().split()


def test_completion_offers_the_commands_and_each_commands_options(tmp_path: Path) -> None:
    assert complete("slurmddp s", tmp_path) == ["submit", "scale", "status"]
    assert set(complete("slurmddp ", tmp_path)) >= {*COMMANDS, "--version"}
    assert complete("slurmddp interrupt --p", tmp_path) == ["--preempt"]
    assert set(complete("slurmddp results --", tmp_path)) >= {"--json", "--csv", "--metric", "--plot"}
