"""Every bad input is refused well, through `python -m slurmddp` as a user meets it: every key of the
schema with a value of the wrong type (and, where the key has a closed set or a range, a value
outside it), bad overrides and experiment files, an output_dir that cannot be created, and every
command with a bad argument. Each must exit 2 with one message that names the key or the argument,
print no traceback, and submit nothing: no run directory appears under output_dir.

Every config case runs through `main`, what `python -m slurmddp` calls, in this process (a fresh
interpreter costs ~1 s of imports a case); one config case per way of refusing, the other bad
submissions and every command run as `python -m slurmddp` subprocesses, side by side, all before
the first of them is checked.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from train_sources import write_main

from slurmddp.cli.main import main
from slurmddp.errors import EXIT_USER_ERROR
from slurmddp.experiment.schema import Experiment

TIMEOUT_S = 120
EXPERIMENT = "entrypoint: train.py:main\ntrain: {lr: 0.1}\n"
NEWLINE = '"a\\nb"'
"""A YAML string holding a newline: what a one-line Slurm value refuses."""


def leaves(kind: Any = Experiment, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf key of the schema (dotted) with its type."""
    hints = typing.get_type_hints(kind)
    for field in dataclasses.fields(kind):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            yield from leaves(hint, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", hint


def _bare(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return hint


def wrong_type(hint: Any) -> str:
    """An override value (YAML) of a type that a key of type `hint` cannot take."""
    bare = _bare(hint)
    origin = typing.get_origin(bare)
    if bare in (int, float):
        return "abc"
    if bare is bool:
        return "maybe"
    if origin is dict:
        return "abc"
    if origin is list:
        return "{a: 1}"
    # str and Literal: a number would read as its text, a list cannot.
    return "[1, 2]"


def closed_set(hint: Any) -> tuple[str, ...]:
    bare = _bare(hint)
    return tuple(map(str, typing.get_args(bare))) if typing.get_origin(bare) is typing.Literal else ()


# Values outside a key's range or form, by key (the closed sets are covered from the types).
BAD_VALUES: dict[str, tuple[str, ...]] = {
    "name": ("-starts-with-a-dash", "'has space'"),
    "profile": ("no-such-profile",),
    "entrypoint.function": ("no_colon", "no_such_module:main"),
    "entrypoint.script": ("no_such_file.py",),
    "entrypoint.module": ("not-a.module", "no_such_module"),
    "entrypoint.args": ("[--lr, '3']",),  # args with a function entrypoint
    "resources.nodes": ("0",),
    "resources.gpus_per_node": ("-1",),
    "resources.tasks_per_node": ("0",),
    "resources.cpus_per_task": ("0",),
    "resources.mem_gb": ("0", "-2"),
    "resources.time": ("forever", "1:2:3:4"),
    "resources.partition": (NEWLINE,),
    "resources.account": (NEWLINE,),
    "resources.qos": (NEWLINE,),
    "resources.constraint": (NEWLINE,),
    "resources.exclude": (NEWLINE,),
    "resources.comment": (NEWLINE,),
    "resources.sbatch": ("{BAD_KEY: 1}", f"{{mail-type: {NEWLINE}}}", "{array: 0-3}", "{signal: USR1@60}"),
    "dist.port": ("80", "70000"),
    "dist.timeout_s": ("0",),
    "dist.srun_mpi": (NEWLINE,),
    "checkpoint.every_steps": ("-1",),
    "checkpoint.every_minutes": ("-1",),
    "checkpoint.keep_last": ("0",),
    "requeue.signal_lead_s": ("5",),
    "requeue.max_timeouts": ("-2",),
    "requeue.max_preemptions": ("-2",),
    "requeue.max_failures": ("-2",),
    "fabric.env": ("{1BAD: x}", "{'A B': x}"),
    "preflight.size_mb": ("0",),
    "preflight.min_bus_gbps": ("-1",),
    "preflight.fail_on_host": (NEWLINE,),
    "ddp.bucket_cap_mb": ("0",),
    "ddp.accumulate": ("0",),
    "telemetry.every_s": ("0",),
    "telemetry.warmup_steps": ("-1",),
    "telemetry.max_steps": ("0",),
    "trackers.mlflow_uri": (NEWLINE,),
    "dist.backend": ("nccl",),  # without GPUs
    **{
        f"trackers.{name}": ("true",)
        for name in ("mlflow", "wandb")
        if importlib.util.find_spec(name) is None
    },
    **({"dist.launcher": ("mpi",)} if importlib.util.find_spec("mpi4py") is None else {}),
}


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    """`python -m slurmddp ARGS`; {tmp} is the cases' directory, {out} this case's output_dir."""
    needle: str
    """What the message must name: the key or the argument."""


def submit(*overrides: str, experiment: str = "exp.yaml") -> tuple[str, ...]:
    return ("submit", experiment, "executor=local", "output_dir={out}", *overrides)


def config_cases() -> Iterator[Case]:
    for key, hint in leaves():
        yield Case(f"{key}:wrong-type", submit(f"{key}={wrong_type(hint)}"), key)
        if closed_set(hint):
            yield Case(f"{key}:not-in-set", submit(f"{key}=bogus"), key)
        for number, value in enumerate(BAD_VALUES.get(key, ())):
            yield Case(f"{key}:bad-value-{number}", submit(f"{key}={value}"), key)
    for section in ("entrypoint", "resources", "dist", "train"):
        yield Case(f"{section}:not-a-mapping", submit(f"{section}=[1]"), section)
    yield Case(
        "combination:static-graph-accumulate", submit("ddp.static_graph=true", "ddp.accumulate=2"), "ddp."
    )
    yield Case(
        "combination:tasks-per-gpu",
        submit("resources.gpus_per_node=2", "resources.tasks_per_node=3"),
        "resources.tasks_per_node",
    )


OTHER_SUBMIT_CASES = [
    Case("override:unknown-key", submit("bogus.key=1"), "bogus.key"),
    Case("override:no-equals", submit("resources.nodes"), "resources.nodes"),
    Case("override:no-key", submit("=1"), "'=1'"),
    Case("override:bad-yaml", submit("resources.nodes=[1"), "resources.nodes"),
    Case("override:sweep-without-sweep", submit("sweep.max_parallel=2"), "sweep"),
    Case("override:sweep-bad-grid", submit("sweep={grid: {lr: abc}}"), "sweep.grid.train.lr"),
    Case("override:sweep-unknown-key", submit("sweep={bogus: 1}"), "bogus"),
    Case("override:sweep-varies-resources", submit("sweep={grid: {resources.nodes: [1, 2]}}"), "resources"),
    Case("file:missing", submit(experiment="{tmp}/no-such.yaml"), "no-such.yaml"),
    Case("file:a-directory", submit(experiment="{tmp}"), "is a directory; name the experiment's YAML file"),
    Case("entrypoint:takes-no-context", submit("entrypoint=noctx.py:main"), "define it as `def main(ctx):`"),
    Case(
        "entrypoint:script-defines-main",
        submit("entrypoint=train.py"),
        'has no `if __name__ == "__main__":` block, so run as a script it would train nothing; '
        "did you mean entrypoint: train.py:main?",
    ),
    Case(
        "train.global_batch:uneven",
        submit("train.global_batch=64", "resources.nodes=3"),
        "override 'resources.nodes=3': train.global_batch: 64 samples cannot be split evenly over 3 ranks",
    ),
    Case("file:malformed-yaml", submit(experiment="{tmp}/malformed.yaml"), "malformed.yaml"),
    Case("file:not-a-mapping", submit(experiment="{tmp}/list.yaml"), "list.yaml"),
    Case("file:unknown-key", submit(experiment="{tmp}/unknown.yaml"), "resources.node"),
    Case("flag:wait-with-value", submit("--wait=yes"), "--wait"),
    Case("flag:unknown", submit("--bogus"), "--bogus"),
    Case("output_dir:under-a-file", submit("output_dir={tmp}/a-file/runs"), "output_dir"),
    Case("output_dir:name-too-long", submit("output_dir={tmp}/" + "x" * 300), "output_dir"),
]

RUN = "{tmp}/run"
"""A run directory (a manifest of job 4242) for the commands that read one."""
COMMAND_CASES = [
    Case("command:none", (), "command"),
    Case("command:unknown", ("bogus",), "bogus"),
    Case("submit:no-experiment", ("submit",), "experiment"),
    Case("dryrun:missing-file", ("dryrun", "{tmp}/no-such.yaml"), "no-such.yaml"),
    Case("dryrun:bad-override", ("dryrun", "exp.yaml", "resources.nodes=0"), "resources.nodes"),
    Case("status:missing-run-dir", ("status", "{tmp}/no-such-run"), "no-such-run"),
    Case("status:bad-job-id", ("status", "not-a-job"), "not-a-job"),
    Case("status:unknown-job-id", ("status", "99999999"), "99999999"),
    Case("status:unknown-flag", ("status", RUN, "--bogus"), "--bogus"),
    Case("logs:no-run", ("logs",), "nothing submitted yet"),
    Case("logs:missing-run-dir", ("logs", "{tmp}/no-such-run"), "no-such-run"),
    Case("logs:rank-not-a-number", ("logs", RUN, "--rank", "abc"), "--rank"),
    Case("logs:rank-out-of-range", ("logs", RUN, "--rank", "9"), "--rank"),
    Case("logs:index-on-a-run", ("logs", RUN, "--index", "3"), "--index"),
    Case("cancel:missing-run-dir", ("cancel", "{tmp}/no-such-run"), "no-such-run"),
    Case("cancel:index-not-a-number", ("cancel", RUN, "--index", "x"), "--index"),
    Case("resubmit:missing-run-dir", ("resubmit", "{tmp}/no-such-run", "--failed"), "no-such-run"),
    Case("resubmit:changes-training", ("resubmit", RUN, "train.lr=0.5"), "train.lr"),
    Case("resubmit:bare-key-changes-training", ("resubmit", RUN, "lr=0.5"), "train.lr"),
    Case("resubmit:changes-output-dir", ("resubmit", RUN, "output_dir={tmp}/elsewhere"), "output_dir"),
    Case("resubmit:bad-override", ("resubmit", RUN, "resources.nodes=0"), "resources.nodes"),
    Case("resubmit:unknown-key", ("resubmit", RUN, "bogus.key=1"), "bogus.key"),
    Case("list:limit-not-a-number", ("list", "-n", "abc"), "--limit"),
    Case("list:limit-zero", ("list", "-n", "0"), "--limit"),
    Case("results:missing-run-dir", ("results", "{tmp}/no-such-run"), "no-such-run"),
    Case("results:bad-mode", ("results", RUN, "--mode", "best"), "--mode"),
    Case("results:unknown-metric", ("results", RUN, "--metric", "nosuch"), "nosuch"),
    Case("results:csv-not-writable", ("results", RUN, "--csv", "{tmp}/a-file/out.csv"), "--csv"),
    Case("interrupt:no-reason", ("interrupt", RUN), "--preempt"),
    Case("interrupt:missing-run-dir", ("interrupt", "{tmp}/no-such-run", "--preempt"), "no-such-run"),
    Case("interrupt:index-on-a-run", ("interrupt", RUN, "--timeout", "--index", "1"), "--index"),
    Case("doctor:unknown-flag", ("doctor", "--bogus"), "--bogus"),
    Case("doctor:override-without-probe", ("doctor", "resources.nodes=2"), "--probe"),
    Case("doctor:bad-probe-override", ("doctor", "--probe", "resources.nodes=abc"), "resources.nodes"),
    Case("mpilaunch:missing-file", ("mpilaunch", "{tmp}/no-such.yaml"), "no-such.yaml"),
    Case("scale:no-nodes", ("scale", "exp.yaml"), "--nodes"),
    Case("scale:empty-nodes", ("scale", "exp.yaml", "output_dir={out}", "--nodes", ""), "--nodes"),
    Case("scale:nodes-not-numbers", ("scale", "exp.yaml", "output_dir={out}", "--nodes", "1,two"), "--nodes"),
    Case("scale:nodes-twice", ("scale", "exp.yaml", "output_dir={out}", "--nodes", "2,2"), "twice"),
    Case(
        "scale:bad-mode",
        ("scale", "exp.yaml", "output_dir={out}", "--nodes", "1,2", "--mode", "fast"),
        "--mode",
    ),
    Case(
        "scale:strong-without-batch",
        ("scale", "exp.yaml", "output_dir={out}", "--nodes", "1,2", "--mode", "strong"),
        "--mode strong",
    ),
    Case(
        "scale:strong-uneven-batch",
        (
            "scale",
            "exp.yaml",
            "output_dir={out}",
            "--nodes",
            "1,3",
            "--mode",
            "strong",
            "train.global_batch=64",
        ),
        "3 rank(s) cannot split it",
    ),
    Case(
        "scale:missing-batch-key",
        ("scale", "exp.yaml", "output_dir={out}", "--nodes", "1,2", "--batch-key", "bs"),
        "--batch-key",
    ),
    Case(
        "scale:bad-bucket",
        ("scale", "exp.yaml", "output_dir={out}", "--nodes", "2", "--bucket-cap-mb", "0"),
        "--bucket-cap-mb",
    ),
    Case(
        "scale:steps-zero",
        ("scale", "exp.yaml", "output_dir={out}", "--nodes", "2", "--steps", "0"),
        "--steps",
    ),
]

CONFIG_CASES = list(config_cases())
REPRESENTATIVE = {
    # One config case per way of refusing, also run as `python -m slurmddp`: OmegaConf's type
    # conversion, a closed set, a list or mapping of the wrong shape, a schema range, a one-line
    # Slurm value, an entrypoint looked up on disk.
    "resources.nodes:wrong-type",
    "precision.autocast:not-in-set",
    "resources.setup:wrong-type",
    "resources:not-a-mapping",
    "dist.port:bad-value-0",
    "resources.partition:bad-value-0",
    "entrypoint.function:bad-value-1",
}
PROCESS_CASES = [
    *(case for case in CONFIG_CASES if case.id in REPRESENTATIVE),
    *OTHER_SUBMIT_CASES,
    *COMMAND_CASES,
]
"""What runs as a subprocess; every config case also runs in this process, through the same
`main` that `python -m slurmddp` calls (an interpreter's imports cost ~1 s a case)."""


def prepare(tmp: Path) -> dict[str, str]:
    """The cases' directory: an experiment and its code, bad experiment files, a run directory,
    fake Slurm commands that know no job; returns the environment the cases run in."""
    write_main(tmp)
    (tmp / "noctx.py").write_text("def main():\n    pass\n")
    (tmp / "exp.yaml").write_text(EXPERIMENT)
    (tmp / "malformed.yaml").write_text("resources: [1,\n")
    (tmp / "list.yaml").write_text("- 1\n")
    (tmp / "unknown.yaml").write_text(EXPERIMENT + "resources: {node: 2}\n")
    (tmp / "a-file").write_text("not a directory\n")
    run = tmp / "run"
    (run / "logs").mkdir(parents=True)
    manifest = {
        "executor": "slurm",
        "job_id": "4242",
        "logs": str(run / "logs"),
        "world_size": 1,
        "experiment": str(tmp / "exp.yaml"),
        "workdir": str(tmp),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "config.yaml").write_text(EXPERIMENT)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    fakes = {
        "squeue": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
        "sacct": "exit 0",
        "scontrol": "echo 'scontrol: error: no controller (a fake for tests)' >&2; exit 1",
        "scancel": "exit 1",
        "sbatch": "echo 'sbatch: error: a fake for tests' >&2; exit 1",
    }
    for name, script in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "SLURMDDP_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["XDG_STATE_HOME"] = str(tmp / "state")
    return env


def arguments(case: Case, tmp: Path, out: Path) -> list[str]:
    return [arg.replace("{tmp}", str(tmp)).replace("{out}", str(out)) for arg in case.args]


def run_case(case: Case, out: Path, tmp: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *arguments(case, tmp, out)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def assert_refused(case: Case, status: int, stdout: str, stderr: str, out: Path) -> None:
    """Exit 2, one error line naming the key or argument, no traceback, no run directory."""
    said = stdout + stderr
    assert status == EXIT_USER_ERROR, said
    assert "Traceback" not in said
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, said
    assert case.needle in errors[0], said
    assert not out.exists(), f"something was submitted: {sorted(out.rglob('*'))}"


@pytest.fixture(scope="module")
def cases_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    return tmp, prepare(tmp)


@pytest.fixture(scope="module")
def results(
    request: pytest.FixtureRequest, cases_dir: tuple[Path, dict[str, str]]
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every selected subprocess case's outcome, run side by side before the first test reads one."""
    tmp, env = cases_dir
    selected = {
        typing.cast(Case, item.callspec.params["case"]).id
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and item.originalname == "test_a_bad_input_is_refused_by_the_command"
    }
    chosen = [case for case in PROCESS_CASES if case.id in selected]
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        done = pool.map(lambda case: (case.id, run_case(case, process_out(tmp, case), tmp, env)), chosen)
        return dict(done)


def process_out(tmp: Path, case: Case) -> Path:
    return tmp / "out" / "process" / str(PROCESS_CASES.index(case))


def test_the_cases_cover_every_key_and_name_real_ones() -> None:
    keys = {key for key, _ in leaves()}
    assert set(BAD_VALUES) <= keys, f"not schema keys: {sorted(set(BAD_VALUES) - keys)}"
    covered = {case.id.split(":")[0] for case in CONFIG_CASES if case.id.endswith(":wrong-type")}
    assert covered == keys
    assert {case.id for case in CONFIG_CASES} >= REPRESENTATIVE
    every = [case.id for case in (*CONFIG_CASES, *OTHER_SUBMIT_CASES, *COMMAND_CASES)]
    assert len(set(every)) == len(every), "case ids must be unique"


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[case.id for case in CONFIG_CASES])
def test_a_bad_config_value_is_refused(
    case: Case,
    cases_dir: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tmp, env = cases_dir
    monkeypatch.chdir(tmp)
    for key in ("PATH", "XDG_STATE_HOME"):
        monkeypatch.setenv(key, env[key])
    out = tmp / "out" / "config" / str(CONFIG_CASES.index(case))
    status = main(arguments(case, tmp, out))  # anything but a SlurmddpError would raise here
    said = capsys.readouterr()
    assert_refused(case, status, said.out, said.err, out)


FOUND_AFTER_LOADING = {
    "profile:bad-value-0",
    "entrypoint.function:bad-value-1",
    "entrypoint.script:bad-value-0",
    "entrypoint.module:bad-value-1",
}
"""Refused after the layers are merged, by a search on disk that names what it searched (a profile,
an entrypoint), not a layer."""


PLANNED = [case for case in CONFIG_CASES if case.id in FOUND_AFTER_LOADING - {"profile:bad-value-0"}]
"""Refused when the run is planned (an entrypoint's file, module or function looked for), after the
experiment loaded: what `config` once printed and exited 0 on (`entrypoint=train.py:mian`), while
submit refused it. The cases refused in loading take the same path in every command."""


@pytest.mark.parametrize("case", PLANNED, ids=[case.id for case in PLANNED])
def test_config_refuses_what_submit_refuses_once_it_plans(
    case: Case,
    cases_dir: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tmp, env = cases_dir
    monkeypatch.chdir(tmp)
    for key in ("PATH", "XDG_STATE_HOME"):
        monkeypatch.setenv(key, env[key])
    out = tmp / "out" / "config-command" / str(PLANNED.index(case))
    status = main(["config", *arguments(case, tmp, out)[1:]])
    said = capsys.readouterr()
    assert_refused(case, status, said.out, said.err, out)


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[case.id for case in CONFIG_CASES])
def test_a_bad_value_given_as_an_override_is_blamed_on_the_override(
    case: Case,
    cases_dir: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if case.id in FOUND_AFTER_LOADING:
        pytest.skip("refused for what was searched")
    tmp, env = cases_dir
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    out = tmp / "out" / "blame" / str(CONFIG_CASES.index(case))
    main(arguments(case, tmp, out))
    override = arguments(case, tmp, out)[-1]
    assert capsys.readouterr().err.startswith(f"slurmddp: error: override {override!r}: ")


def test_the_places_searched_are_each_named_once(
    cases_dir: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Submitted from the experiment's own folder, the submit and experiment folders are one; a
    profile's folders are named as absolute paths, whichever way they were reached."""
    tmp, env = cases_dir
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    monkeypatch.delenv("SLURMDDP_PROFILE_PATH", raising=False)
    out = f"output_dir={tmp}/out/searched"
    main(["submit", "exp.yaml", "executor=local", out, "entrypoint.script=no_such_file.py"])
    said = capsys.readouterr().err
    assert said == f"slurmddp: error: entrypoint.script: no file 'no_such_file.py' (looked in {tmp})\n"
    main(["submit", "exp.yaml", "executor=local", out, "profile=mycluster"])
    said = capsys.readouterr().err
    assert (
        f"no profile named 'mycluster' (looked for mycluster.yaml in {tmp}/configs, {tmp.parent}/configs)"
        in said
    )


@pytest.mark.process
def test_an_unreadable_experiment_is_refused_without_a_traceback(tmp_path: Path) -> None:
    """Mode 000 stops anyone but root; root is stopped too once it drops the power to read any
    file (CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), as setpriv does for the command."""
    env = prepare(tmp_path)
    (tmp_path / "exp.yaml").chmod(0)
    case = Case(
        "file:unreadable", submit(), "exp.yaml: cannot read it (Permission denied); check its permissions"
    )
    prefix: list[str] = []
    if os.access(tmp_path / "exp.yaml", os.R_OK):
        if shutil.which("setpriv") is None:
            pytest.skip("this user reads any file, and setpriv is missing to drop that power")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "slurmddp", *arguments(case, tmp_path, tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert_refused(case, proc.returncode, proc.stdout, proc.stderr, tmp_path / "out")


@pytest.mark.parametrize("case", PROCESS_CASES, ids=[case.id for case in PROCESS_CASES])
def test_a_bad_input_is_refused_by_the_command(
    case: Case, results: dict[str, subprocess.CompletedProcess[str]], cases_dir: tuple[Path, dict[str, str]]
) -> None:
    tmp, _ = cases_dir
    proc = results[case.id]
    assert_refused(case, proc.returncode, proc.stdout, proc.stderr, process_out(tmp, case))


def test_a_refused_submission_is_not_in_the_index(
    results: dict[str, subprocess.CompletedProcess[str]], cases_dir: tuple[Path, dict[str, str]]
) -> None:
    tmp, _ = cases_dir
    assert not (tmp / "state" / "slurmddp" / "runs.jsonl").exists()
    assert (tmp / "a-file").read_text() == "not a directory\n"


def test_an_output_dir_in_an_immutable_directory_is_refused(tmp_path: Path) -> None:
    """What a read-only tree does to a user, for root: chattr +i stops even root from creating."""
    env = prepare(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i does not work here")
    case = Case("output_dir:immutable", submit(f"output_dir={locked}/runs"), "output_dir")
    try:
        proc = run_case(case, tmp_path / "out", tmp_path, env)
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert_refused(case, proc.returncode, proc.stdout, proc.stderr, tmp_path / "out")
    assert f"output_dir: cannot create the run directory {locked}/runs/exp/" in proc.stderr
    assert "Operation not permitted" in proc.stderr and "Set output_dir" in proc.stderr
    assert list(locked.iterdir()) == []
