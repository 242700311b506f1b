"""Shared fixtures and helpers. The real Slurm cluster (tests/slurm_lab) is started lazily, once per
session and Slurm generation, by the first test that asks for `slurm_env`, and stopped at the end
of the session.

A test that uses the cluster runs once on each generation of the lab (Slurm 22.05 and 24.11), as
`test_x[22.05]` and `test_x[24.11]`, where what it proves can differ between them: submission and
its script, arrays, accounting, the lab itself. A module whose tests prove our own runtime (resume,
failures, fabric, frameworks) names the one generation it runs on with
`pytest.mark.lab_generation("22.05")`, the modules spread over both: the suite's time is mostly lab
time, and those tests would prove the same twice. `SLURMDDP_LAB_SLURM=24.11` runs every test on that
one generation; `SLURMDDP_LAB_EVERY_GENERATION=1` runs every test on both. Tests that use it
are marked `@pytest.mark.slurm`; a test that requests `slurm_env` gets the marker automatically,
so `pytest -m "not slurm"` runs everything that needs no cluster. A test that starts a process gets
the `process` marker, and one not marked that starts one fails (tests/process_rule.py), so
`pytest -m "not slurm and not process"` is the unit run of seconds.

Under pytest-xdist (`-n N --dist loadgroup`, what scripts/test.sh runs) each worker starts labs of
its own (`SLURMDDP_LAB_INSTANCE`: own bridge, namespaces, ports), so tests that preempt with a
whole-cluster job, take a node down or slow a link never meet another test's job. A module's tests
on one generation stay on one worker (an `xdist_group`, `lab_group`), and so do a module's tests
that start processes and share a module-scoped fixture: its reference runs are made once.

No test touches the user's own state: every test gets its own XDG_STATE_HOME (slurmddp's index of
submissions), XDG_CONFIG_HOME and XDG_DATA_HOME (`own_user_state`), the session its own caches, and
the session fails when the user's runs.jsonl changed under it.

This file applies to every folder under tests/, and the helpers below are imported by name
(`from conftest import wait_for_job`): pyproject's `pythonpath = ["tests"]` puts this folder on
sys.path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import suite_clock
from lab_processes import parent_pid as parent_pid
from lab_processes import rank_mains as rank_mains
from lab_processes import rank_pids as rank_pids
from process_rule import (
    ProcessInUnitTest,
    mark_process_tests,
    may_start_processes,
    prime_process_caches,
    processes_refused,
)

from slurmddp.cluster.slurm import retrying

ROOT = Path(__file__).resolve().parents[1]
"""The repository: examples/, configs/ and templates/ are read from there."""
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
SYNTHETIC = ROOT / "examples" / "synthetic.yaml"
"""The seeded-MLP example: steps and width set freely, for long runs and big checkpoints."""
LAB_DIR = Path(__file__).resolve().parent / "slurm_lab"
LAB_UP = LAB_DIR / "up"
LAB_DOWN = LAB_DIR / "down"
EXIT_CANNOT_RUN = 77  # `up`: this machine cannot run the lab (not root, no namespaces, ...)
EXPORT_PREFIX = "export SLURM_CONF="
# `up` may have to apt-get install Slurm and MariaDB first on a fresh machine.
UP_TIMEOUT_S = 900
DOWN_TIMEOUT_S = 120

# Slurm states after which a job never runs again (sacct spelling; "CANCELLED by 0" -> "CANCELLED").
# Script code (needs os, signal, sys and types imported): die_in_shutdown() makes the process die
# of SIGABRT while Python shuts down, after every exit handler, as a torch C++ thread taking the GIL
# then makes it die (job.scriptrun's module doc).
DIE_IN_SHUTDOWN = """
class DiesInShutdown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGABRT)


def die_in_shutdown():
    holder = types.ModuleType("holder")
    holder.obj = DiesInShutdown()
    sys.modules["holder"] = holder
"""

TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


GENERATIONS = ("22.05", "24.11")
"""The Slurm releases the lab runs (tests/slurm_lab): every cluster test runs on each."""
USER_STATE_VARS = ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")
"""Where programs keep a user's own state: each test gets directories of its own."""
SESSION_CACHE_VARS = (
    "XDG_CACHE_HOME",
    "MPLCONFIGDIR",
    "WANDB_CONFIG_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_DATA_DIR",
)
"""Caches and settings of libraries the tests use: one set per session (matplotlib's font cache
takes seconds to build)."""
# The user's own index of submissions, as the environment the suite was started from names it.
# xdist workers start from the controller's environment, in which XDG_STATE_HOME is already the
# session's: the original is handed down in SLURMDDP_TEST_USER_INDEX.
USER_INDEX = Path(
    os.environ.setdefault(
        "SLURMDDP_TEST_USER_INDEX",
        str(
            Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
            / "slurmddp"
            / "runs.jsonl"
        ),
    )
)


def file_digest(path: Path) -> str | None:
    """sha256 of a file's bytes; None when there is no such file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


# pytest's own fixture for running pytest on files a test writes (tests/test_suite_time.py).
pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # Before any fixture copies os.environ: what module- and session-scoped fixtures start (the
    # labs, reference runs) writes here too, never into the user's directories.
    session_dir = Path(tempfile.mkdtemp(prefix="slurmddp-tests-"))
    config.stash[_SESSION_DIR] = session_dir
    for name in (*USER_STATE_VARS, *SESSION_CACHE_VARS):
        os.environ[name] = str(session_dir / name.lower())
    config.stash[_USER_INDEX_DIGEST] = file_digest(USER_INDEX)
    prime_process_caches()
    suite_clock.start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash[_SESSION_DIR], ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # pytest-rerunfailures' own list (-rR) showed none of a CI run's two reruns under xdist.
    # Each with what its first run failed on: the report of the run that counts shows only its own
    # failure, and a first run can leave what the second trips on.
    reruns = terminalreporter.stats.get("rerun", [])
    if reruns:
        terminalreporter.section("run again after a failure (LOADED_RERUNS)")
        for report in reruns:
            terminalreporter.line(f"RERUN {report.nodeid}")
            text = report.longreprtext.splitlines()
            # pytest's `E ` lines: the error and its message, as under FAILURES.
            for line in [line for line in text if line.startswith("E ")][:RERUN_REASON_LINES] or text[-3:]:
                terminalreporter.line(f"    {line}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if file_digest(USER_INDEX) != session.config.stash[_USER_INDEX_DIGEST]:
        print(f"\nthe test session changed the user's own index of submissions {USER_INDEX}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_SESSION_DIR = pytest.StashKey[Path]()
_USER_INDEX_DIGEST = pytest.StashKey["str | None"]()


@pytest.fixture(autouse=True)
def own_user_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """This test's own XDG_STATE_HOME, XDG_CONFIG_HOME and XDG_DATA_HOME, set in os.environ (and
    so in what subprocesses inherit) and in `slurm_env`."""
    home = tmp_path_factory.mktemp("user")
    env = {name: str(home / name.lower()) for name in USER_STATE_VARS}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def lab_generations(pinned: str | None = None) -> tuple[str, ...]:
    """The generations to run a cluster test on: the one SLURMDDP_LAB_SLURM names; else the one
    its module is `pinned` to, unless SLURMDDP_LAB_EVERY_GENERATION=1; else both."""
    chosen = os.environ.get("SLURMDDP_LAB_SLURM")
    for name, value in (("SLURMDDP_LAB_SLURM", chosen), ("lab_generation", pinned)):
        if value and value not in GENERATIONS:
            raise pytest.UsageError(f"{name}={value}: the lab runs {' or '.join(GENERATIONS)}")
    if chosen:
        return (chosen,)
    if pinned and os.environ.get("SLURMDDP_LAB_EVERY_GENERATION") != "1":
        return (pinned,)
    return GENERATIONS


def lab_instance() -> str:
    """This process's lab instance: 0, or under xdist worker gwN its own N+1 (SLURMDDP_LAB_INSTANCE)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return str(int(worker.removeprefix("gw")) + 1) if worker.startswith("gw") else "0"


def worker_job_id(n: int) -> int:
    """Fake SLURM_JOB_ID `n` (below 1000) made this process's own: ranks derive MASTER_PORT from
    the job id, and the ranks of two xdist workers must not pick the same port on this machine."""
    return 1000 * int(lab_instance()) + n


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "slurm_generation" in metafunc.fixturenames:
        pinned = metafunc.definition.get_closest_marker("lab_generation")
        # Module scope: a module's reference runs are made once per generation.
        metafunc.parametrize(
            "slurm_generation", lab_generations(pinned.args[0] if pinned else None), scope="module"
        )


LOADED_RERUNS = 1
"""Runs again, once, of a failed test that starts processes or runs on a lab (pytest-rerunfailures).
The suite keeps 2 cores ~98% busy with four labs, and at that load a wait sized for the work
sometimes falls short (a job COMPLETING past 30 s, sacct 15 s behind squeue): each full run had
one to four such failures among ~1,670 tests, a different few each time. A fault of the code
fails both runs; every rerun is listed at the end (`RERUN` lines), so none goes unseen."""
RERUN_REASON_LINES = 12
"""Lines of a first run's failure shown under its `RERUN` line."""


def lab_group(nodeid: str, generation: str) -> str:
    """The xdist group of a lab test: its module on its generation. No "]" in it: xdist's
    loadgroup takes a nodeid's group only where its last "@" comes after its last "]"; a name
    ending in "]" made each test a group of its own, and every test set up its module's
    reference runs (and OCI bundle) again."""
    return f"{nodeid.split('::', 1)[0]}:{generation}"


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture (an uninterrupted reference run): its
    module's tests then go to one xdist worker, which makes the fixture once. Tests scheduled one
    by one made it again on every worker, and again whenever a worker came back to the module."""
    defs = getattr(item, "_fixtureinfo", None)
    return defs is not None and any(
        chain[-1].scope == "module" for chain in defs.name2fixturedefs.values() if chain
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "slurm_env" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
            item.add_marker(pytest.mark.slurm)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "slurm_generation" in callspec.params:
            group = lab_group(item.nodeid, callspec.params["slurm_generation"])
            item.add_marker(pytest.mark.xdist_group(group))
    mark_process_tests(items)
    for item in items:
        grouped = item.get_closest_marker("xdist_group") is not None
        if item.get_closest_marker("process") and not grouped and shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("process"):
            item.add_marker(pytest.mark.flaky(reruns=LOADED_RERUNS))


def _refusing_processes(item: pytest.Item) -> Iterator[None]:
    """One phase of a test not marked `process`: starting one fails it (process_rule), also when
    the code that started it swallowed the error."""
    if not may_start_processes(item):
        with processes_refused(item) as refused:
            yield
        if refused:
            raise ProcessInUnitTest(f"{item.nodeid} started a process unmarked: {', '.join(refused)}")
    else:
        yield


# Setup too: a module-scoped fixture set up for the test counts as its own. Not teardown: a test's
# teardown also ends the module- and session-scoped fixtures of the tests before it (the labs).
pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_refusing_processes)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_refusing_processes)


class Labs:
    """The labs this process started, one per generation, each on first use; `up`'s outcome
    (its environment, or the skip or failure) is kept, so a lab that cannot start is tried only
    twice, not again for every module."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, str] | BaseException] = {}

    def run(self, script: Path, generation: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """`up` or `down` of this process's lab of `generation`."""
        # Several sessions may share a lab; `down` stops it only when no live holder is left.
        env = {
            **os.environ,
            "SLURMDDP_LAB_HOLDER": str(os.getpid()),
            "SLURMDDP_LAB_SLURM": generation,
            "SLURMDDP_LAB_INSTANCE": lab_instance(),
        }
        return subprocess.run(
            [str(script)], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def env(self, generation: str) -> dict[str, str]:
        if generation not in self.outcomes:
            for _ in range(2):
                try:
                    self.outcomes[generation] = self.up(generation)
                    break
                except pytest.skip.Exception as exc:
                    self.outcomes[generation] = exc
                    break
                except pytest.fail.Exception as exc:
                    # Once more: the next `up` tears a half-up lab down and starts it afresh (with
                    # four labs starting at once, a MariaDB bootstrap once failed).
                    self.outcomes[generation] = exc
        outcome = self.outcomes[generation]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def up(self, generation: str) -> dict[str, str]:
        try:
            with suite_clock.spent("lab up"):
                proc = self.run(LAB_UP, generation, UP_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"{LAB_UP} ({generation}) did not finish in {UP_TIMEOUT_S}s:\n{exc.stderr!r}", pytrace=False
            )
        if proc.returncode == EXIT_CANNOT_RUN:
            lines = proc.stderr.strip().splitlines()
            reason = lines[-1] if lines else f"{LAB_UP} exited {EXIT_CANNOT_RUN}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI must run the Slurm {generation} lab, but: {reason}", pytrace=False)
            pytest.skip(reason)
        stdout_lines = proc.stdout.strip().splitlines()
        last = stdout_lines[-1] if stdout_lines else ""
        if proc.returncode != 0 or not last.startswith(EXPORT_PREFIX):
            pytest.fail(
                f"{LAB_UP} ({generation}) exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                f"--- stderr\n{proc.stderr}",
                pytrace=False,
            )
        # Job variables of a surrounding allocation (pytest run inside a Slurm job) must not leak
        # into the sbatch/srun calls of the tests.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(lab_exports(last, env))
        # A test that runs `up` or `down` itself reaches this lab with them.
        env.update(SLURMDDP_LAB_SLURM=generation, SLURMDDP_LAB_INSTANCE=lab_instance())
        return env

    def down(self) -> None:
        for generation in self.outcomes:  # also after a failed or half-finished `up`
            with suite_clock.spent("lab down"):
                proc = self.run(LAB_DOWN, generation, DOWN_TIMEOUT_S)
            if proc.returncode != 0:
                # A finalizer that raises would hide the test results; say it loudly instead.
                print(f"\n{LAB_DOWN} ({generation}) exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")


@pytest.fixture(scope="session")
def labs(request: pytest.FixtureRequest) -> Labs:
    """The labs of this session; SLURMDDP_LAB_KEEP=1 leaves them running after it."""
    started = Labs()
    if os.environ.get("SLURMDDP_LAB_KEEP") != "1":
        request.addfinalizer(started.down)
    return started


@pytest.fixture(scope="module")
def slurm_lab(labs: Labs, slurm_generation: str) -> dict[str, str]:
    """The session's environment plus SLURM_CONF (and for 24.11 the client commands on PATH) of
    the running lab of this generation. For module-scoped fixtures; tests use `slurm_env`.

    Skips when the machine cannot run the lab (`up` exits 77), except under CI=true, where that
    fails."""
    return labs.env(slurm_generation)


@pytest.fixture
def slurm_env(slurm_lab: dict[str, str], own_user_state: dict[str, str]) -> Iterator[dict[str, str]]:
    """`slurm_lab` with this test's own user state directories. The jobs the test leaves in the
    queue are cancelled after it: a 400-epoch run that a failed check left trained on beside the
    rerun, and beside the rest of the suite on those cores, for minutes."""
    env = {**slurm_lab, **own_user_state}
    before = set(queued_jobs(env))
    yield env
    left = [job for job in queued_jobs(env) if job not in before]
    if left:
        slurm_command(["scancel", *left], env, patience=5)


def queued_jobs(env: Mapping[str, str]) -> list[str]:
    """The ids of the jobs in the lab's queue (array tasks as ID_TASK); none where squeue fails."""
    # Little patience: a test may leave the lab's slurmctld stopped (test_controller_down_cluster.py).
    proc = slurm_command(["squeue", "-h", "-o", "%i"], env, patience=5)
    return proc.stdout.split() if proc.returncode == 0 else []


def lab_exports(line: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `up`'s last line: `export SLURM_CONF=...`, and for the 24.11 lab
    ` PATH=WRAPPERS:$PATH` (its client commands come first), `$PATH` meaning `env`'s."""
    names = dict(word.split("=", 1) for word in shlex.split(line.removeprefix("export ")))
    if "PATH" in names:
        names["PATH"] = names["PATH"].replace("$PATH", env.get("PATH", ""))
    return names


SLURM_PATIENCE_S = 60.0
"""How long the tests' Slurm commands ride out a blip of the lab's slurmctld or slurmdbd: with
several labs on 2 cores, slurmctld once missed squeue's MessageTimeout (24.11, "Socket timed out
on send/recv operation")."""


def slurm_command(
    args: Sequence[str], env: Mapping[str, str], *, check: bool = False, patience: float = SLURM_PATIENCE_S
) -> subprocess.CompletedProcess[str]:
    """A Slurm client command run with `env`, output captured, and run again while it fails on an
    error the package's own calls ride out too (slurm.may_retry: a transient one, where running
    the command twice is safe), for up to `patience` seconds. With `check`, a failure that remains
    raises RuntimeError with what the command said."""
    proc = retrying(
        args,
        lambda: subprocess.run(list(args), env=dict(env), capture_output=True, text=True, check=False),
        patience,
    )
    if check and proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}"
        raise RuntimeError(f"{' '.join(args)} failed: {said}")
    return proc


SACCT_LAG_S = 60.0
"""How long sacct may lag behind squeue on a job's end."""


def wait_for_job(job_id: str, env: Mapping[str, str], timeout: float = 120.0, poll: float = 0.5) -> str:
    """Wait until Slurm job `job_id` has ended and return its final state from sacct.

    Polls `squeue -h -j ID` (not `sbatch -W`, which polls after 2, 8, then 32 s). A requeued job
    counts as running until its last run ends. The state is sacct's first word ("CANCELLED by 0"
    -> "CANCELLED"); for a whole array, the distinct task states joined by "," (pass "ID_N" for one
    task). Raises TimeoutError when the job is still queued or running after `timeout` seconds,
    RuntimeError when squeue fails other than on a blip of slurmctld (`slurm_command`).
    """
    with suite_clock.spent("slurm job"):
        return _wait_for_job(job_id, env, timeout, poll)


def _wait_for_job(job_id: str, env: Mapping[str, str], timeout: float, poll: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        proc = slurm_command(["squeue", "-h", "-j", job_id, "-o", "%T"], env)
        # Once the job is gone from slurmctld (MinJobAge), squeue says "Invalid job id" and fails.
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise RuntimeError(f"squeue -j {job_id} failed: {proc.stderr.strip()}")
        states = proc.stdout.split() if proc.returncode == 0 else []
        if all(state in TERMINAL_STATES for state in states):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {sorted(set(states))} after {timeout:.0f}s")
        time.sleep(poll)

    # slurmctld sends the end record to slurmdbd asynchronously: sacct lags a few seconds, and in CI
    # (four labs on two cores), once after a slurmctld restart, more than 15 s.
    final: list[str] = []
    sacct_deadline = time.monotonic() + SACCT_LAG_S
    while True:
        proc = slurm_command(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], env)
        final = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode == 0 and final and all(state in TERMINAL_STATES for state in final):
            return ",".join(sorted(set(final)))
        if time.monotonic() > sacct_deadline:
            held = slurm_command(["scontrol", "-o", "show", "job", job_id], env)
            raise TimeoutError(
                f"job {job_id} left the queue but after {SACCT_LAG_S:.0f} s sacct still says "
                f"{final or proc.stderr.strip()!r}; slurmctld: {(held.stdout or held.stderr).strip()[:400]!r}"
            )
        time.sleep(0.5)


@pytest.fixture
def slurm_wait(slurm_env: dict[str, str]) -> Callable[..., str]:
    """`slurm_wait(job_id, timeout=120.0) -> final state`, bound to the lab's environment."""

    def wait(job_id: str, timeout: float = 120.0) -> str:
        return wait_for_job(job_id, slurm_env, timeout=timeout)

    return wait


def submit_run(env: dict[str, str], out: Path, *overrides: str, experiment: Path = SYNTHETIC) -> Path:
    """`submit EXPERIMENT OVERRIDES output_dir=OUT` from OUT's parent (made if missing); the run
    directory."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with suite_clock.spent("slurmddp command"):
        proc = subprocess.run(
            [sys.executable, "-m", "slurmddp", "submit", str(experiment), *overrides, f"output_dir={out}"],
            env=env,
            cwd=out.parent,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = out.glob("*/*/manifest.json")
    return manifest.parent


def progress_step(run: Path) -> int:
    """The step rank 0 last recorded (RUN_DIR/progress.json); -1 before any."""
    try:
        return int(json.loads((run / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def run_job_id(run: Path) -> str:
    """The Slurm job id a run's manifest records."""
    return str(json.loads((run / "manifest.json").read_text())["job_id"])


def preempt_with_high_job(env: dict[str, str], tmp: Path) -> None:
    """Submit a job to the lab's high partition that needs every core of every node: it preempts
    whatever runs in the debug partition."""
    subprocess.run(
        [
            "sbatch",
            "-p",
            "high",
            "-N",
            "3",
            "--exclusive",
            "-t",
            "1",
            "-o",
            str(tmp / "high-%j.out"),
            "--wrap",
            "sleep 3",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )


def wait_until(what: str, check: Callable[[], bool], timeout: float = 180) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with suite_clock.spent("run progress"):
        while True:
            began = time.monotonic()
            if check():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            # A check that runs a command (`slurmddp status`: ~0.8 s of CPU) every 0.2 s would take
            # a core from the runs it waits for: such a check waits 4 times its own length.
            time.sleep(max(0.2, 4 * (time.monotonic() - began)))


def slurmddp(
    env: dict[str, str], cwd: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m slurmddp ARGS...` in `cwd` with `env`, output captured."""
    with suite_clock.spent("slurmddp command"):
        return subprocess.run(
            [sys.executable, "-m", "slurmddp", *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def run_dirs(out: Path) -> list[Path]:
    """The run directories under output_dir `out` (OUT/NAME/STAMP/manifest.json)."""
    return sorted(p.parent for p in out.glob("*/*/manifest.json"))


def only_run(out: Path) -> Path:
    dirs = run_dirs(out)
    assert len(dirs) == 1, dirs
    return dirs[0]


def mpi_library_error() -> str | None:
    """Why mpi4py cannot start MPI here, or None when it can."""
    proc = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["no output"])[-1]


@pytest.fixture
def slurm_commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The Slurm commands slurmddp runs (e.g. the requeue decision's scontrol requeue), recorded
    instead of run; each answers with success and no output."""
    from slurmddp.cluster import slurm

    calls: list[list[str]] = []

    def fake_run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(list(args), 0, "", "")

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls


def write_sweep(tmp_path: Path, sweep: str, extra: str = "") -> Path:
    """An experiment with a `train.py:main` beside it, `extra` YAML lines and the sweep `sweep`."""
    (tmp_path / "train.py").write_text("def main(ctx):\n    return {}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"entrypoint: train.py:main\n{extra}train: {{lr: 0.1, width: 8, label: x}}\nsweep: {sweep}\n"
    )
    return exp


def rank_pid(run: Path, rank: int, timeout: float = 60) -> int:
    """The process of one rank of `run`, once there is one (a resident task forks it after its
    own start)."""
    found: list[int] = []

    def one() -> bool:
        found[:] = rank_mains(run, rank=rank)
        return len(found) == 1

    wait_until(f"rank {rank}'s process", one, timeout=timeout)
    return found[0]
