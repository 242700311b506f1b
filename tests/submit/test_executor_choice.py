"""`executor: auto` means Slurm wherever Slurm's commands are, and local only where none is: a
controller that does not answer is an error that says why and how to go on (a preview warns
instead), never a run on the login node. dryrun warns when it cannot tell the Slurm release. Fake
sbatch and scontrol on PATH play the cluster."""

from __future__ import annotations

import io
import shutil
import stat
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT

from slurmddp.cli import dryrun
from slurmddp.cli.main import main
from slurmddp.cluster import slurm
from slurmddp.defaults import Executor
from slurmddp.errors import EXIT_SLURM_ERROR, SlurmCommandError, SubmitError
from slurmddp.experiment.load import load_experiment
from slurmddp.manage import index
from slurmddp.submit import submitter
from slurmddp.submit.plan import build
from slurmddp.submit.prepare import ExecutorChoice, choose_executor, plan_for, resolve_executor

# What scontrol ping says where no controller can be reached (Slurm 22.05, no SLURM_CONF).
DEAD = """echo 'scontrol: error: _establish_config_source: failed to fetch config' >&2
echo 'scontrol: fatal: Could not establish a configuration source' >&2
exit 1"""
UP = "echo 'Slurmctld(primary) at ctl is UP'"
# A controller down (22.05 and 24.11 alike): its line on stdout, a banner on stderr.
BANNER = "*****************************************"
DOWN = f"""echo 'Slurmctld(primary) at ctl is DOWN'
echo '{BANNER}' >&2; echo '** RESTORE SLURMCTLD DAEMON TO SERVICE **' >&2; echo '{BANNER}' >&2
exit 1"""
BACKUP_UP = "echo 'Slurmctld(primary) at ctl is DOWN'; echo 'Slurmctld(backup) at ctl2 is UP'; exit 1"


def fake_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: str | None, *, sbatch: bool = True
) -> None:
    """Only these tools on PATH: sbatch (unless not `sbatch`), and scontrol running `scontrol`
    (None: no scontrol)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        **({"sbatch": "exit 0"} if sbatch else {}),
        **({"scontrol": scontrol} if scontrol is not None else {}),
    }
    for name, script in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.mark.process  # scontrol ping
@pytest.mark.parametrize("requested", ["auto", "slurm"])
def test_a_silent_controller_is_an_error_that_says_why_and_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requested: Executor
) -> None:
    fake_slurm(tmp_path, monkeypatch, DEAD)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/wrong.conf")
    with pytest.raises(SlurmCommandError) as raised:
        choose_executor(requested)
    said = str(raised.value)
    assert "no Slurm controller answers (scontrol ping: scontrol: fatal: Could not establish a " in said
    assert "nothing was submitted" in said and "SLURM_CONF=/etc/slurm/wrong.conf" in said
    assert "executor=local" in said
    assert raised.value.exit_code == EXIT_SLURM_ERROR


@pytest.mark.process  # scontrol ping
def test_submit_on_a_silent_controller_trains_nothing_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_slurm(tmp_path, monkeypatch, DEAD)
    handed: list[object] = []
    monkeypatch.setattr(submitter, "submit", lambda *args: handed.append(args))
    out = tmp_path / "runs"
    assert main(["submit", str(QUICKSTART), f"output_dir={out}"]) == EXIT_SLURM_ERROR
    err = capsys.readouterr().err
    assert "no Slurm controller answers" in err and "executor=local" in err and "Traceback" not in err
    assert handed == [] and not out.exists() and index.records() == []


@pytest.mark.process  # scontrol ping
def test_a_preview_plans_for_slurm_and_warns_when_no_controller_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_slurm(tmp_path, monkeypatch, DEAD)
    loaded = load_experiment(QUICKSTART, [])
    plan = plan_for(loaded, run_dir=tmp_path / "run", preview=True)
    assert plan.executor == "slurm" and "#SBATCH --nodes=2" in plan.batch_script()
    assert plan.notes[0].startswith("warning: no Slurm controller answers (scontrol ping: scontrol: fatal")
    assert "submit refuses until one does" in plan.notes[0] and "executor=local" in plan.notes[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.process  # scontrol ping
def test_a_controller_that_comes_back_within_the_patience_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = tmp_path / "asked"
    # DOWN on the first ping, as a restarting slurmctld is; UP from the second.
    # Shell builtins only: PATH holds the fakes alone.
    again = f'[ -e {asked} ] && again=1\necho >> {asked}\n[ -n "$again" ] && {{ {UP}; exit 0; }}'
    fake_slurm(tmp_path, monkeypatch, f"{again}\n{DOWN}")
    monkeypatch.setattr("slurmddp.cluster.slurm.RETRY_FIRST_PAUSE_S", 0.01)
    assert choose_executor("auto") == ExecutorChoice("slurm")
    assert len(asked.read_text().splitlines()) == 2


@pytest.mark.process  # scontrol ping
def test_a_controller_down_for_longer_is_given_up_on_and_a_bad_config_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = tmp_path / "asked"
    fake_slurm(tmp_path, monkeypatch, f"echo >> {asked}\n{DOWN}")
    monkeypatch.setattr("slurmddp.cluster.slurm.RETRY_FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr("slurmddp.cluster.slurm.CONTROLLER_PATIENCE_S", 0.1)
    with pytest.raises(SlurmCommandError, match=r"scontrol ping: Slurmctld\(primary\) at ctl is DOWN"):
        choose_executor("auto")
    assert len(asked.read_text().splitlines()) > 1
    assert slurm.controller_unreachable() == "Slurmctld(primary) at ctl is DOWN"
    (tmp_path / "bin" / "scontrol").write_text(f"#!/bin/sh\necho >> {asked}\n{DEAD}\n")
    asked.unlink()
    assert "Could not establish a configuration source" in (slurm.controller_unreachable() or "")
    assert len(asked.read_text().splitlines()) == 1, "a configuration scontrol cannot read was asked again"


def test_slurm_commands_without_sbatch_are_an_error_not_a_local_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_slurm(tmp_path, monkeypatch, UP, sbatch=False)
    with pytest.raises(SubmitError, match=r"scontrol is on PATH but sbatch is not: .*add executor=local"):
        choose_executor("auto")


@pytest.mark.process  # scontrol ping
@pytest.mark.parametrize("scontrol", [UP, BACKUP_UP], ids=["primary", "backup"])
def test_auto_takes_slurm_when_a_controller_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: str
) -> None:
    fake_slurm(tmp_path, monkeypatch, scontrol)
    assert choose_executor("auto") == ExecutorChoice("slurm")


@pytest.mark.process  # scontrol ping
def test_a_ping_that_hangs_is_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, f"exec {shutil.which('sleep')} 30")
    monkeypatch.setattr("slurmddp.cluster.slurm.PING_TIMEOUT_S", 0.5)
    monkeypatch.setattr("slurmddp.cluster.slurm.CONTROLLER_PATIENCE_S", 0)
    with pytest.raises(SlurmCommandError, match=r"\(scontrol ping: no answer within 0\.5 s\)"):
        choose_executor("auto")


def test_without_sbatch_auto_is_local_and_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert choose_executor("auto") == ExecutorChoice("local")


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ((24, 11, 5), "# slurmddp: written for Slurm 24.11.5 (sbatch --version)\n"),
        (
            None,
            "# slurmddp: warning: the Slurm release could not be found (sbatch --version printed none); "
            "written for any release from 22.05 on: the script exports SRUN_CPUS_PER_TASK, which 22.05 "
            "and 23.02 need and later releases ignore\n",
        ),
    ],
)
def test_dryrun_says_which_slurm_release_the_script_is_for(
    tmp_path: Path, version: tuple[int, int, int] | None, said: str
) -> None:
    loaded = load_experiment(QUICKSTART, [])
    plan = build(
        loaded, executor="slurm", workdir=ROOT, run_dir=tmp_path, interpreter="python3", slurm_version=version
    )
    out = io.StringIO()
    dryrun.show(loaded, [], plan, out)
    assert said in out.getvalue()
    assert ("export SRUN_CPUS_PER_TASK" in plan.batch_script()) is (version is None)


def test_resolving_alone_takes_slurm_where_its_commands_are_without_asking_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a scaling study asks before its arguments are checked: no ping (the guard fails a test
    # that starts a process unmarked), and never the local executor on a machine with Slurm.
    fake_slurm(tmp_path, monkeypatch, DEAD)
    assert resolve_executor("auto") == "slurm"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert resolve_executor("auto") == "local"
