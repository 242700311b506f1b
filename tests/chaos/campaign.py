"""A randomized fault campaign on the Slurm lab: real runs of the quickstart (2 nodes x 2 ranks),
submitted and read back only through `python -m slurmddp`, each hit by one fault drawn from a
seeded schedule (faults.py). A run passes when it ends COMPLETED with the uninterrupted run's
parameter digest, or, for a fault no tool can survive, with a final reason that names the fault;
and when no checkpoint that was complete was lost other than by keep_last pruning.

    python tests/chaos/campaign.py --seed S --trials N [--fault KIND] [--keep-lab]

starts the lab (SLURMDDP_LAB_SLURM, default 24.11; SLURMDDP_LAB_INSTANCE), runs the reference
once (cached in --workdir), prints the seed, a line per trial and the table, and stops the lab
again unless --keep-lab. Any seed replays: the schedule and each fault's draws depend on it alone
(when a fault lands still depends on the machine). docs/faults.md has the measured tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from conftest import (  # noqa: E402
    LAB_DOWN,
    LAB_UP,
    QUICKSTART,
    ROOT,
    lab_exports,
    run_dirs,
    slurm_command,
    wait_for_job,
)
from faults import FAULTS, Injected, Trial, slurmddp  # noqa: E402
from lab_control import LabDaemons  # noqa: E402
from run_view import CheckpointLedger, FaultMissed, begins, ends, step_times  # noqa: E402

EPOCHS = 24
"""528 steps: an uninterrupted run trains ~15 s on the lab, ~25 s with its start."""
EVERY_STEPS = 20
KEEP_LAST = 3
SETTINGS = (
    f"train.epochs={EPOCHS}",
    "train.log_every=1",
    f"checkpoint.every_steps={EVERY_STEPS}",
    f"checkpoint.keep_last={KEEP_LAST}",
)
FIRST_TARGET, LAST_TARGET = 30, 360
"""Faults aim at a step drawn from this range (of 528): the stop signal takes 1-3 s to land, and
the run must not be over by then."""
TRIAL_TIMEOUT_S = 300
FULL_DISK_KB = (1200, 2000, 2800)
"""Sizes of the small tmpfs: a checkpoint is ~750 KB, so the 2nd, 3rd or 4th save finds it full."""


@dataclass(frozen=True)
class Outcome:
    seed: int
    index: int
    fault: str
    note: str
    state: str
    attempts: int
    ends: list[str]
    """How each attempt ended (attempts.jsonl), in order."""
    bit_identical: bool
    reason: str
    """The run's last end, as `slurmddp status` shows it."""
    lost: list[int]
    recover_s: float | None
    new_attempt: bool
    seconds: float
    run: str

    @property
    def passed(self) -> bool:
        fault = FAULTS[self.fault]
        named = not fault.survivable and any(word in self.reason for word in fault.names)
        return (self.bit_identical or named) and not self.lost and not self.note.startswith("missed")


def schedule(seed: int, trials: int, only: str | None = None) -> list[str]:
    """The faults of `trials` runs: every kind once in a shuffled round, round after round."""
    if only is not None:
        return [only] * trials
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < trials:
        round_ = sorted(FAULTS)
        rng.shuffle(round_)
        kinds += round_
    return kinds[:trials]


def reference_digest(env: Mapping[str, str], workdir: Path) -> str:
    """The uninterrupted run's parameter digest, cached per settings, sources and Slurm release."""
    sources = b"".join(p.read_bytes() for p in (QUICKSTART, ROOT / "examples" / "quickstart_train.py"))
    release = subprocess.run(["sbatch", "--version"], env=dict(env), capture_output=True, text=True).stdout
    key = hashlib.sha256(sources + repr((SETTINGS, release)).encode()).hexdigest()[:16]
    cache = workdir / f"reference-{key}.json"
    if cache.is_file():
        return str(json.loads(cache.read_text())["digest"])
    out = workdir / f"reference-{key}"
    started = time.monotonic()
    run, job = submit(env, out, ())
    state = wait_for_job(job, env, timeout=TRIAL_TIMEOUT_S)
    if state != "COMPLETED":
        raise RuntimeError(f"the reference run {run} ended {state}")
    digest = final_digest(run)
    cache.write_text(json.dumps({"digest": digest, "seconds": round(time.monotonic() - started, 1)}))
    return digest


def submit(env: Mapping[str, str], out: Path, overrides: Sequence[str]) -> tuple[Path, str]:
    proc = slurmddp(env, "submit", str(QUICKSTART), *SETTINGS, *overrides, f"output_dir={out}")
    if proc.returncode != 0:
        raise RuntimeError(f"submit failed: {proc.stdout}{proc.stderr}")
    (run,) = run_dirs(out)
    return run, str(json.loads((run / "manifest.json").read_text())["job_id"])


def final_digest(run: Path) -> str | None:
    try:
        ranks = json.loads((run / "result.json").read_text())["ranks"]
    except (OSError, ValueError, KeyError):
        return None
    digests = {r["param_sha256"] for r in ranks}
    return digests.pop() if len(digests) == 1 else None


def run_trial(
    env: Mapping[str, str], workdir: Path, seed: int, index: int, kind: str, reference: str
) -> Outcome:
    fault = FAULTS[kind]
    rng = random.Random(f"{seed}-{index}")
    scratch = workdir / f"seed{seed}-trial{index:03d}-{kind}"
    scratch.mkdir(parents=True)
    lab = LabDaemons(env)
    started = time.monotonic()
    small_disk = scratch / "tmpfs" if kind == "disk-full" else None
    overrides: tuple[str, ...] = ()
    if small_disk is not None:
        small_disk.mkdir()
        size_kb = rng.choice(FULL_DISK_KB)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(small_disk)], check=True
        )
        # Jobs run in mount namespaces of their own (the nodes', the 24.11 root's) that do not see
        # a mount made now; through this process's root they reach it.
        overrides = (f"checkpoint.dir=/proc/{os.getpid()}/root{small_disk}",)
    try:
        run, job = submit(env, scratch / "runs", overrides)
        checkpoints = small_disk if small_disk is not None else run / "checkpoints"
        trial = Trial(run, job, checkpoints, env, lab, rng, rng.randrange(FIRST_TARGET, LAST_TARGET), scratch)
        ledger = CheckpointLedger(checkpoints)
        with watching(ledger):
            try:
                injected = fault.inject(trial)
            except FaultMissed as exc:
                injected = Injected(None, f"missed: {exc}")
                slurmddp(env, "cancel", str(run))
            state = wait_for_job(job, env, timeout=TRIAL_TIMEOUT_S)
        shown = json.loads(slurmddp(env, "status", str(run), "--json").stdout)["elements"][0]
        outcome = Outcome(
            seed=seed,
            index=index,
            fault=kind,
            note=injected.note,
            state=state,
            attempts=int(shown["attempts"]),
            ends=[end.reason for end in ends(run)],
            bit_identical=state == "COMPLETED" and final_digest(run) == reference,
            reason=str(shown.get("last_end") or ""),
            lost=ledger.lost(KEEP_LAST, injected.damaged),
            recover_s=recovery_s(run, injected.at),
            new_attempt=injected.at is not None and any(b.time > injected.at for b in begins(run)),
            seconds=round(time.monotonic() - started, 1),
            run=str(run),
        )
    finally:
        if small_disk is not None:
            subprocess.run(["umount", "-l", str(small_disk)], check=False)
        settle(lab)
    return outcome


@contextmanager
def watching(ledger: CheckpointLedger) -> Iterator[None]:
    """The run's complete checkpoints noted every 0.1 s while the body runs."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            ledger.poll()
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def recovery_s(run: Path, at: float | None) -> float | None:
    """Fault -> the first step logged after it, by the next attempt where there is one."""
    if at is None:
        return None
    later = [b.time for b in begins(run) if b.time > at]
    since = later[0] if later else at
    logged = [when for _, when in step_times(run) if when >= since]
    return round(min(logged) - at, 1) if logged else None


def settle(lab: LabDaemons) -> None:
    """The lab as a trial found it: nodes in service, no job left (a preempting job, a cancel)."""
    lab.resume_nodes()
    deadline = time.monotonic() + 120
    while True:
        # Checked: a failed squeue prints no job, which is not an empty queue.
        queue = slurm_command(["squeue", "-h"], lab.env, check=True).stdout
        idle = slurm_command(
            ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], lab.env, check=True
        ).stdout.split()
        if not queue.strip() and len(set(idle)) == 3:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the lab did not settle: queue {queue!r}, idle nodes {idle}")
        time.sleep(0.5)


def campaign(
    env: Mapping[str, str], workdir: Path, seed: int, trials: int, only: str | None = None, first: int = 0
) -> list[Outcome]:
    print(f"seed {seed}: {trials} trial(s); replay with --seed {seed} --trials {trials}", flush=True)
    settle(LabDaemons(env))
    reference = reference_digest(env, workdir)
    outcomes = []
    for index, kind in list(enumerate(schedule(seed, trials, only)))[first:]:
        outcome = run_trial(env, workdir, seed, index, kind, reference)
        outcomes.append(outcome)
        print(line(outcome), flush=True)
        with (workdir / "outcomes.jsonl").open("a") as handle:
            handle.write(json.dumps(asdict(outcome)) + "\n")
    return outcomes


def line(o: Outcome) -> str:
    verdict = "bit-identical" if o.bit_identical else f"{o.state}: {o.reason}"
    recover = (
        "-" if o.recover_s is None else f"{o.recover_s:.1f} s" + ("" if o.new_attempt else " (same attempt)")
    )
    lost = f", LOST complete checkpoints {o.lost}" if o.lost else ""
    return (
        f"  [{'pass' if o.passed else 'FAIL'}] trial {o.index} {o.fault}: {o.note}; "
        f"attempts ended {'/'.join(o.ends)}, {verdict}; recovered in {recover}{lost}; {o.seconds:.0f} s"
    )


def table(outcomes: Sequence[Outcome]) -> str:
    """Markdown: per fault, trials, survived bit-identical, other final reasons, time to recover."""
    rows = [
        "| fault | trials | survived bit-identical | final reason otherwise "
        "| time to recover (median, range) | attempts ended | complete checkpoints lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in sorted({o.fault for o in outcomes}):
        mine = [o for o in outcomes if o.fault == kind]
        others = Counter(f"{o.state}: {o.reason}" for o in mine if not o.bit_identical)
        reasons = "; ".join(f"{n} x {text}" for text, n in others.most_common()) or "-"
        times = [o.recover_s for o in mine if o.recover_s is not None]
        recover = f"{statistics.median(times):.1f} s ({min(times):.1f}-{max(times):.1f})" if times else "-"
        lost = sum(len(o.lost) for o in mine)
        survived = sum(o.bit_identical for o in mine)
        shapes = Counter("/".join(o.ends) for o in mine)
        attempts = "; ".join(f"{n} x {shape}" for shape, n in shapes.most_common())
        rows.append(f"| {kind} | {len(mine)} | {survived} | {reasons} | {recover} | {attempts} | {lost} |")
    return "\n".join(rows)


def lab_env(generation: str, instance: str) -> dict[str, str]:
    """Start (or find) the lab and return the environment that reaches it."""
    env = {**os.environ, "SLURMDDP_LAB_SLURM": generation, "SLURMDDP_LAB_INSTANCE": instance}
    proc = subprocess.run([str(LAB_UP)], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{LAB_UP} exited {proc.returncode}: {proc.stderr.strip()}")
    base = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    return {**base, **lab_exports(proc.stdout.strip().splitlines()[-1], base)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    parser.add_argument("--trials", type=int, default=len(FAULTS))
    parser.add_argument("--fault", choices=sorted(FAULTS), help="only this kind")
    parser.add_argument("--from-trial", type=int, default=0, help="go on from this trial of the schedule")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/slurmddp-chaos"))
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    generation = os.environ.get("SLURMDDP_LAB_SLURM", "24.11")
    instance = os.environ.get("SLURMDDP_LAB_INSTANCE", "0")
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = lab_env(generation, instance)
    # The runs' index of submissions goes to the workdir, never into the user's own.
    for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        env[name] = str(args.workdir / name.lower())
    try:
        outcomes = campaign(env, args.workdir, seed, args.trials, args.fault, args.from_trial)
    finally:
        if not args.keep_lab:
            lab = {**os.environ, "SLURMDDP_LAB_SLURM": generation, "SLURMDDP_LAB_INSTANCE": instance}
            subprocess.run([str(LAB_DOWN)], env=lab, check=False)
    print(f"\nseed {seed}, Slurm {generation}\n{table(outcomes)}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
