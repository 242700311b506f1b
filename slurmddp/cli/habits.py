"""Flags that other tools take (sbatch, srun, torchrun, Hydra's `--key=value`), answered with the
experiment's KEY=VALUE that slurmddp takes instead."""

from __future__ import annotations

from collections.abc import Sequence

from slurmddp.experiment.schema import SBATCH_KEYS

FLAG_KEYS: dict[str, str] = {
    **{f"--{option}": key for option, key in SBATCH_KEYS.items()},
    **dict.fromkeys(("-N", "--nnodes"), "resources.nodes"),
    **dict.fromkeys(("--nproc_per_node", "--nproc-per-node"), "resources.tasks_per_node"),
    "-t": "resources.time",
    "-p": "resources.partition",
    "-A": "resources.account",
    "-q": "resources.qos",
    "-C": "resources.constraint",
    "-x": "resources.exclude",
    "-c": "resources.cpus_per_task",
}
"""sbatch's and torchrun's flags for what an experiment sets under resources:."""


SWEEP_FLAGS = {
    "-m": "Hydra's multirun",
    "--multirun": "Hydra's multirun",
    "--array": "sbatch's --array",
    "-a": "sbatch's --array",
}
"""Flags that ask for many runs: slurmddp's many runs are one array, from a `sweep:` section."""


def unrecognized(argv: Sequence[str], extras: Sequence[str], takes_overrides: bool) -> str:
    """argparse's complaint about `extras` (what it could not place in `argv`); for a command that
    takes KEY=VALUE overrides, each flag among them with the override that says the same."""
    many = next(
        (SWEEP_FLAGS[word.partition("=")[0]] for word in extras if word.partition("=")[0] in SWEEP_FLAGS),
        None,
    )
    if takes_overrides and many is not None:
        return (
            f"unrecognized arguments: {' '.join(extras)}; for {many}, slurmddp runs one Slurm array "
            "from a sweep: section in the experiment file, as `sweep: {grid: {lr: [0.01, 0.1]}, "
            "max_parallel: 4}` (Slurm's %4), or `sweep: {search: {trials: 12, params: {lr: "
            '"tag(log, interval(1e-4, 1))"}}, metric: val_loss, mode: min}` for Optuna\'s'
            " TPE with pruning; docs/runs.md, Sweeps"
        )
    flags = _flags(argv, extras) if takes_overrides else []
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)}"
    given = " ".join(flag if value is None or "=" in flag else f"{flag} {value}" for flag, value in flags)
    instead = " ".join(as_override(flag, value) for flag, value in flags)
    return (
        f"unrecognized arguments: {given}; slurmddp takes the experiment's settings as KEY=VALUE, "
        f"not as flags: write {instead}"
    )


def as_override(flag: str, value: str | None) -> str:
    """`--nodes`, `2` -> `resources.nodes=2`; `--lr=0.1` -> `lr=0.1`."""
    name, _, attached = flag.partition("=")
    key = FLAG_KEYS.get(name) or name.lstrip("-").replace("-", "_")
    shown = attached or value
    return f"{key}={shown if shown is not None else 'VALUE'}"


def _flags(argv: Sequence[str], extras: Sequence[str]) -> list[tuple[str, str | None]]:
    """Each unrecognized flag in `argv` with the word after it, where that word is a value (not
    another flag, nor a KEY=VALUE override)."""
    found: list[tuple[str, str | None]] = []
    for position, word in enumerate(argv):
        if not word.startswith("-") or word == "-" or word not in extras:
            continue
        following = argv[position + 1] if position + 1 < len(argv) else ""
        is_value = following and not following.startswith("-") and "=" not in following
        found.append((word, following if is_value and "=" not in word else None))
    return found
