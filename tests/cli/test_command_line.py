"""The command line as a newcomer meets it: every command that takes a run defaults to the newest,
the habits of other tools (a script for an experiment, torchrun and sbatch flags, Hydra's `+key`)
are answered with what slurmddp takes instead, `config` prints the resolved experiment, `list`
shows each run's state, a closed pipe ends a command quietly, and a local job id whose process id
was taken by another process is neither reported running nor signalled."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import write_sweep

from slurmddp.cli import manage_cmd
from slurmddp.cli.main import main
from slurmddp.errors import EXIT_JOB_FAILED, EXIT_USER_ERROR, SlurmddpError
from slurmddp.experiment.load import load_experiment
from slurmddp.manage import actions, backend, index
from slurmddp.rundir.config import write_config

EXPERIMENT = "entrypoint: train.py:main\ntrain: {lr: 0.1}\n"
SLURM_JOB = "4242"


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("def main(ctx):\n    return {}\n")
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT)
    return path


@pytest.fixture
def slurm_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[list[str]]]:
    """A Slurm run in the index whose job squeue says is running; the Slurm commands run are
    recorded instead of run."""
    from slurmddp.cluster import slurm

    calls: list[list[str]] = []

    def fake_run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        said = f"{SLURM_JOB}|RUNNING\n" if args[0] == "squeue" else ""
        return subprocess.CompletedProcess(list(args), 0, said, "")

    monkeypatch.setattr(slurm, "run", fake_run)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / f"{SLURM_JOB}_0_log.out").write_text("rank 0 says hello\n")
    manifest = {"executor": "slurm", "job_id": SLURM_JOB, "logs": str(run / "logs"), "world_size": 1}
    (run / "manifest.json").write_text(json.dumps(manifest))
    index.remember(run, "run", "exp", SLURM_JOB)
    return run, calls


# Finding 1: every command that takes a run defaults to the newest, as status does.


@pytest.mark.parametrize("command", ["status", "logs", "interrupt", "cancel", "resubmit", "results"])
def test_every_command_that_takes_a_run_defaults_to_the_newest(command: str) -> None:
    parser = manage_cmd.parsers()[command]
    extra = ["--preempt"] if command == "interrupt" else []
    assert parser.parse_intermixed_args(extra).run is None
    assert "default: the newest submission" in parser.format_help()


def test_logs_without_a_run_shows_the_newest_runs_log(
    slurm_run: tuple[Path, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["logs"]) == 0
    assert capsys.readouterr().out == "rank 0 says hello\n"


def test_resubmit_takes_overrides_without_a_run(
    slurm_run: tuple[Path, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, _ = slurm_run
    asked: list[tuple[str, list[str]]] = []

    def resubmit_run(ref: str, overrides: list[str], *_: object) -> None:
        asked.append((ref, overrides))
        raise SlurmddpError("recorded")

    monkeypatch.setattr(actions, "resubmit_run", resubmit_run)
    assert main(["resubmit", "resources.time=04:00:00"]) == EXIT_USER_ERROR
    assert asked == [(str(run.resolve()), ["resources.time=04:00:00"])]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cancel_without_a_run_and_without_a_terminal_asks_for_yes(
    slurm_run: tuple[Path, list[list[str]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, calls = slurm_run
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["cancel"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert str(run) in err and "--yes" in err
    assert not [call for call in calls if call[0] == "scancel"]


def test_cancel_without_a_run_names_the_run_it_cancels(
    slurm_run: tuple[Path, list[list[str]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, calls = slurm_run
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["cancel", "--yes"]) == 0
    assert f"the newest submission: {run}" in capsys.readouterr().out
    assert ["scancel", SLURM_JOB] in calls


@pytest.mark.parametrize(("answer", "cancelled"), [("y\n", True), ("\n", False), ("no\n", False)])
def test_cancel_without_a_run_on_a_terminal_asks_first(
    answer: str,
    cancelled: bool,
    slurm_run: tuple[Path, list[list[str]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, calls = slurm_run
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    assert main(["cancel"]) == 0
    out = capsys.readouterr().out
    assert f"cancel the newest submission, {run} (job {SLURM_JOB})? [y/N]" in out
    assert (["scancel", SLURM_JOB] in calls) == cancelled
    assert ("nothing cancelled" in out) != cancelled


# Finding 3: habits from other tools are answered with what slurmddp takes.


def test_a_python_script_for_an_experiment_says_how_to_make_one(
    experiment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dryrun", str(experiment.parent / "train.py")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "takes an experiment YAML file, not a Python script" in err
    assert "entrypoint: " in err and "python -m slurmddp init" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--nodes", "2"], "resources.nodes=2"),
        (["-N", "2"], "resources.nodes=2"),
        (["--nnodes=2"], "resources.nodes=2"),
        (["--ntasks-per-node", "4"], "resources.tasks_per_node=4"),
        (["--nproc_per_node", "4"], "resources.tasks_per_node=4"),
        (["--gpus-per-node", "8"], "resources.gpus_per_node=8"),
        (["--time", "02:00:00"], "resources.time=02:00:00"),
        (["-t", "30"], "resources.time=30"),
        (["--partition", "gpu"], "resources.partition=gpu"),
        (["-p", "gpu"], "resources.partition=gpu"),
        (["--lr=0.1"], "lr=0.1"),
        (["--train.lr", "0.1", "--nodes", "2"], "train.lr=0.1 resources.nodes=2"),
    ],
)
def test_a_flag_of_another_tool_is_answered_with_the_experiments_key(
    flags: list[str], said: str, experiment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["dryrun", str(experiment), *flags])
    assert exited.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert f"write {said}" in err and "KEY=VALUE" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["-m", "lr=0.01,0.1"], "Hydra's multirun"),
        (["--multirun", "lr=0.01,0.1"], "Hydra's multirun"),
        (["--array=0-3"], "sbatch's --array"),
        (["--array", "0-3"], "sbatch's --array"),
    ],
)
def test_asking_for_many_runs_by_flag_is_answered_with_the_sweep_section(
    flags: list[str], named: str, experiment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["dryrun", str(experiment), *flags])
    assert exited.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert f"for {named}, slurmddp runs one Slurm array from a sweep: section" in err
    assert "sweep: {grid: {lr: [0.01, 0.1]}" in err and "sweep: {search: {trials: 12" in err
    assert "write " not in err  # not the KEY=VALUE of a flag (`m=VALUE`, `array=0-3`)


def test_a_command_without_overrides_keeps_argparses_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--bogus"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err and "KEY=VALUE" not in err


@pytest.mark.parametrize("command", ["submit", "dryrun", "config"])
def test_a_command_without_its_experiment_asks_for_that_alone(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Overrides are optional: `submit` alone once said "required: experiment, KEY=VALUE".
    with pytest.raises(SystemExit) as exited:
        main([command])
    assert exited.value.code == EXIT_USER_ERROR
    assert (
        capsys.readouterr().err.splitlines()[-1].endswith("the following arguments are required: experiment")
    )


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_experiment_is_said_to_be_empty(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    assert main(["dryrun", str(path)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert f"{path}: the file is empty" in err and "entrypoint: train.py" in err


@pytest.mark.parametrize("override", ["+train.foo=1", "++train.foo=1"])
def test_hydras_add_syntax_says_that_the_plain_key_adds_it(
    override: str, experiment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dryrun", str(experiment), override]) == EXIT_USER_ERROR
    assert "write train.foo=1: a key new under train: is added" in capsys.readouterr().err


# Finding 4: `config` prints the resolved experiment.


def test_config_prints_what_the_runs_config_yaml_would_hold(
    experiment: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", str(experiment), "lr=0.5", "train.foo=1", "resources.nodes=2"]) == 0
    printed = capsys.readouterr().out
    write_config(
        tmp_path, load_experiment(experiment, ["lr=0.5", "train.foo=1", "resources.nodes=2"]).resolved
    )
    assert printed == (tmp_path / "config.yaml").read_text()
    shown = yaml.safe_load(printed)
    assert shown["train"] == {"lr": 0.5, "foo": 1} and shown["resources"]["nodes"] == 2


def test_config_of_a_sweep_prints_an_element_by_index(
    experiment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment.write_text(EXPERIMENT + "sweep: {grid: {lr: [0.1, 0.2]}}\n")
    assert main(["config", str(experiment), "--index", "1"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["lr"] == 0.2
    assert main(["config", str(experiment), "--index", "2"]) == EXIT_USER_ERROR
    assert "the sweep's indices are 0-1" in capsys.readouterr().err


def test_config_errors_as_submit_does(experiment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", str(experiment), "resources.nodes=0"]) == EXIT_USER_ERROR
    assert "override 'resources.nodes=0'" in capsys.readouterr().err


# Finding 5: `list` shows states; a closed pipe ends quietly; a reused process id is not ours.


def test_list_shows_each_runs_state_from_one_squeue_call(
    slurm_run: tuple[Path, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, calls = slurm_run
    assert main(["list"]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "state" in header.split() and "RUNNING" in row.split()
    assert [call[0] for call in calls].count("squeue") == 1
    assert main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "RUNNING"


@pytest.fixture
def foreign_local_run(tmp_path: Path) -> Path:
    """A local run whose job id is the process id of a process that is not its controller (this
    test's own): what an old local run looks like once the system gave its id to another process."""
    run = tmp_path / "old"
    (run / "logs").mkdir(parents=True)
    job = str(os.getpid())
    manifest = {"executor": "local", "job_id": job, "logs": str(run / "logs"), "world_size": 1}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_a_reused_process_id_is_not_reported_running(
    foreign_local_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--json", str(foreign_local_run)]) == 0
    assert "RUNNING" not in capsys.readouterr().out


def test_a_reused_process_id_is_not_signalled(
    foreign_local_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(backend.os, "kill", lambda pid, signum: sent.append((pid, signum)))
    backend.LOCAL.cancel([str(os.getpid())])
    assert main(["cancel", str(foreign_local_run)]) == 0
    assert sent == [] and "nothing to cancel" in capsys.readouterr().out


# Finding 2: resubmit --wait and a sweep's submit --wait end as submit --wait of a run does.


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.process
def test_resubmit_wait_ends_with_submits_summary(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("def main(ctx):\n    raise RuntimeError('boom')\n")
    (tmp_path / "exp.yaml").write_text(
        f"entrypoint: train.py:main\nexecutor: local\noutput_dir: {tmp_path / 'out'}\n"
    )
    first = _cli(tmp_path, "submit", "exp.yaml", "--wait")
    assert first.returncode == EXIT_JOB_FAILED, first.stdout + first.stderr
    again = _cli(tmp_path, "resubmit", "--wait")
    assert again.returncode == EXIT_JOB_FAILED, again.stdout + again.stderr
    for line in ("  run dir:", "  logs:", "next:", "logs --err", "resubmit"):
        assert line in again.stdout, again.stdout


def _local_sweep(tmp_path: Path) -> Path:
    """A sweep of two elements run here to their end, each logging a loss; its experiment."""
    exp = write_sweep(
        tmp_path, "{grid: {lr: [0.1, 0.2]}, metric: loss}", f"executor: local\noutput_dir: {tmp_path}/out\n"
    )
    (tmp_path / "train.py").write_text("def main(ctx):\n    ctx.log(0, loss=ctx.config.train.lr)\n")
    done = _cli(tmp_path, "submit", str(exp), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    return exp


@pytest.mark.process
def test_a_sweeps_submit_wait_ends_with_the_next_commands(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1]}}", f"executor: local\noutput_dir: {tmp_path}/out\n")
    done = _cli(tmp_path, "submit", str(exp), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    tail = done.stdout[done.stdout.rindex("next:") :]
    assert "status" in tail and "results" in tail, done.stdout


@pytest.mark.process
def test_a_closed_pipe_ends_each_command_quietly(tmp_path: Path) -> None:
    exp = _local_sweep(tmp_path)
    commands = [
        ["status", "--json"],
        ["list"],
        ["list", "--json"],
        ["results", "--json"],
        ["config", str(exp)],
    ]
    started = []
    for command in commands:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmddp", *command],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        proc.stdout.close()  # as `| true` does: the reader is gone before the first write
        started.append(proc)
    for command, proc in zip(commands, started, strict=True):
        _, err = proc.communicate(timeout=120)
        said = f"{command}: {err.decode()}"
        assert proc.returncode == 128 + signal.SIGPIPE, said
        assert "Traceback" not in said and "BrokenPipe" not in said, said
