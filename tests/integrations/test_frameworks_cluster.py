"""Framework scripts on the real cluster (3 nodes x 1 rank), written as their frameworks' docs
teach plus slurmddp's one line (examples/frameworks/), preempted by real `high` jobs twice at steps
drawn at random: both stops are preemptions, no optimizer step is made twice or lost on any rank,
and the final parameters are bit-identical to an uninterrupted run's. The uninterrupted run is
made once, locally with the same 3 ranks (gloo sums in the same order over loopback as over the
lab's bridge; with 2, a + b == b + a would hide a changed order). Several ranks on one node are
preempted by test_container_cluster.py's quickstart (2 nodes x 2). The same scripts without the
line, under `integrations: auto`, are stopped and resumed bit-exact by the local tests
(test_transformers.py's damaged-checkpoint test, test_lightning.py's SIGTERM-only test): the
import hook that adds the line works the same under either executor, and the line it adds is the
one preempted here.

Per case beyond that: the first attempt's DDP bucket layout recorded (ddp.resume_buckets);
accelerate's under gradient accumulation, against the same loop without the helper, one stop
mid-epoch; transformers' code after `trainer.train()` run once, by the last attempt; the plain
loop's attempt records counting the steps its log times."""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import slurmddp, wait_for_job, wait_until
from framework_runs import FRAMEWORKS, assert_records_count_the_steps, final, finish, submit

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]

RANKS = 3
LAYOUT = (f"resources.nodes={RANKS}", "resources.tasks_per_node=1")
HIGH_JOB = ("-p", "high", "-N", "3", "--exclusive", "-t", "1", "--wrap", "sleep 3")


@dataclass(frozen=True)
class Case:
    """A framework's example: its experiment, the arguments a lab run gets (enough steps, slow
    enough for two preemptions), where each rank logs its steps and what names the digest."""

    experiment: str
    args: tuple[str, ...]
    """`{out}` stands for the run's output_dir."""
    steps: str = "steps-{rank}.log"
    """Relative to the run directory."""
    digest: str = "digest"
    tensorboard: bool = False
    """The script logs to TensorBoard: every attempt must write into one run (one directory)."""
    reference_args: tuple[str, ...] = ()
    """Added to the uninterrupted run's arguments."""
    epochs: int | None = None
    """The epochs the run trains for: one of the two stops must come mid-epoch."""
    after_train: bool = False
    """The script appends its step to RUN_DIR/after_train.txt once training is over: what a user
    does after training, which no attempt that stopped for a requeue may run."""
    timed_steps: bool = False
    """Each line of the step logs gives the step's time too: the attempt records' step counts are
    checked against them."""

    def overrides(self, out: Path, reference: bool = False) -> tuple[str, ...]:
        args = (*self.args, *self.reference_args) if reference else self.args
        return (f"entrypoint.args=[{','.join(arg.format(out=out) for arg in args)}]", f"output_dir={out}")


CASES = {
    # A run of a few seconds would end before the second preemption came.
    "torchrun": Case("torchrun.yaml", ("--epochs", "12", "--step-sleep", "0.03"), timed_steps=True),
    # Under accumulation, with the uninterrupted run made by the same loop without the helper
    # (which neither saves nor resumes).
    "accelerate": Case(
        "accelerate.yaml",
        ("--epochs", "12", "--accumulate", "2", "--record-steps", "--step-sleep", "0.05"),
        steps="steps/rank-{rank}.txt",
        digest="param_sha256",
        reference_args=("--no-helper",),
        epochs=12,
    ),
    "transformers": Case(
        "transformers.yaml",
        (
            "--max-steps",
            "120",
            "--record-steps",
            "{out}/steps",
            "--step-sleep",
            "0.05",
            "--report-to",
            "tensorboard",
            # Trainer's default finds unused parameters, where DDP never rebuilds its buckets: off,
            # the resumed attempts must replay the first one's rebuilt layout to end bit-exact.
            "--find-unused=false",
        ),
        steps="../../steps/rank-{rank}.txt",
        digest="sha256",
        tensorboard=True,
        after_train=True,
    ),
    "lightning": Case(
        "lightning.yaml",
        ("--steps", "120", "--sleep", "0.05"),
        steps="steps/rank-{rank}.txt",
        digest="sha256",
        tensorboard=True,  # Lightning's default logger
    ),
}


def made(run: Path, case: Case, rank: int = 0) -> list[int]:
    """The optimizer steps `rank` made, in order (each line of its log starts with the step)."""
    try:
        text = (run / case.steps.format(rank=rank)).read_text()
    except FileNotFoundError:
        return []
    return [int(line.split()[0]) for line in text.splitlines()]


def assert_each_step_once(run: Path, case: Case, total: int) -> None:
    for rank in range(RANKS):
        done = made(run, case, rank)
        assert sorted(done) == list(range(1, total + 1)), (rank, [s for s in done if done.count(s) > 1][:5])


@pytest.fixture(scope="session", params=sorted(CASES))
def framework(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def references() -> dict[str, tuple[str, int]]:
    """Uninterrupted runs made so far, by case: their digest and number of optimizer steps."""
    return {}


@pytest.fixture
def reference(
    framework: str, references: dict[str, tuple[str, int]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, int]:
    """The uninterrupted run's digest and its number of optimizer steps, made once per case."""
    if framework not in references:
        case = CASES[framework]
        out = tmp_path_factory.mktemp(f"reference-{framework}") / "runs"
        ranks = ("resources.nodes=1", f"resources.tasks_per_node={RANKS}")
        run = finish(submit(out, case.experiment, *ranks, *case.overrides(out, reference=True)), out)
        total = len(made(run, case))
        assert_each_step_once(run, case, total)
        references[framework] = (str(final(run)[case.digest]), total)
    return references[framework]


def lab_submit(env: dict[str, str], out: Path, case: Case) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    experiment = str(FRAMEWORKS / case.experiment)
    proc = slurmddp(env, out.parent, "submit", experiment, *LAYOUT, *case.overrides(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = out.glob("*/*/manifest.json")
    return manifest.parent


def ends(run: Path) -> list[dict[str, Any]]:
    try:
        lines = (run / "attempts.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [record for line in lines if (record := json.loads(line))["event"] == "end"]


def preempt_at(env: dict[str, str], run: Path, step: int, tmp: Path, case: Case = CASES["torchrun"]) -> None:
    """Once rank 0 made `step` optimizer steps, a job on the high partition takes every node."""
    wait_until(f"step {step}", lambda: len(made(run, case)) >= step or any(e["final"] for e in ends(run)))
    assert not any(e["final"] for e in ends(run)), f"the run ended before step {step}: {ends(run)}"
    count = len(ends(run))
    high = ["sbatch", "-o", str(tmp / "high-%j.out"), *HIGH_JOB]
    subprocess.run(high, env=env, check=True, capture_output=True)
    wait_until("the preempted attempt to end", lambda: len(ends(run)) > count)


def test_preempted_twice_at_random_steps_ends_bit_exact(
    slurm_env: dict[str, str], tmp_path: Path, framework: str, reference: tuple[str, int]
) -> None:
    case = CASES[framework]
    digest, total = reference
    rng = random.Random()
    first = rng.randrange(total // 8, total // 3)
    second = rng.randrange(first + total // 6, total // 2 + total // 6)
    run = lab_submit(slurm_env, tmp_path / "runs", case)
    preempt_at(slurm_env, run, first, tmp_path, case)
    preempt_at(slurm_env, run, second, tmp_path, case)
    job = json.loads((run / "manifest.json").read_text())["job_id"]
    assert wait_for_job(str(job), slurm_env, timeout=600) == "COMPLETED", (run / "attempts.jsonl").read_text()
    reasons = [e["reason"] for e in ends(run)]
    assert reasons == ["preemption", "preemption", "completed"], (first, second, reasons)
    assert_each_step_once(run, case, total)
    assert final(run)[case.digest] == digest, f"preempted at steps {first} and {second}"
    # The first attempt recorded its DDP's rebuilt bucket layout, which the resumed ones were built
    # in (ddp.resume_buckets): what makes their first steps sum as the uninterrupted run did.
    assert (run / "ddp" / "0.json").is_file(), sorted(p.name for p in run.iterdir())
    stops = [e["step"] for e in ends(run)][:2]
    if case.epochs is not None:
        assert any(stop % (total // case.epochs) for stop in stops), (stops, total)
    if case.after_train:
        assert (run / "after_train.txt").read_text().split() == [str(total)], "it ran on a stop"
    if case.timed_steps:
        assert_records_count_the_steps(run, total)
    if case.tensorboard:
        # Each attempt opens its writer at least once, all in one directory: one run continued.
        events = list(run.glob("**/events.out.tfevents.*"))
        assert len({path.parent for path in events}) == 1 and len(events) >= 3, events


def test_a_script_that_saves_on_sigterm_alone_survives_the_slurm_signal(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """Slurm sends USR2 to every process of the step before the rank passes SIGTERM on; USR2's
    default action used to kill such a script before its handler could save (stop.json read
    `"script_status": -12`). Now it saves, exits 0, and the next attempt resumes from its save."""
    total = 300
    script = Path(__file__).with_name("sigterm_only_train.py")
    (tmp_path / "exp.yaml").write_text(f"name: sigterm\nentrypoint: {script} {total}\n")
    out = tmp_path / "runs"
    proc = slurmddp(slurm_env, tmp_path, "submit", str(tmp_path / "exp.yaml"), *LAYOUT, f"output_dir={out}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = out.glob("*/*/manifest.json")
    run = manifest.parent
    preempt_at(slurm_env, run, random.randrange(40, 150), tmp_path)
    stop = json.loads((run / "stop.json").read_text())
    assert stop["script_status"] == 0, stop
    job = json.loads(manifest.read_text())["job_id"]
    assert wait_for_job(str(job), slurm_env, timeout=600) == "COMPLETED", (run / "attempts.jsonl").read_text()
    assert [e["reason"] for e in ends(run)] == ["preemption", "completed"]
    assert_each_step_once(run, CASES["torchrun"], total)
