"""A scaling study: one experiment at several sizes, plus a 1-rank baseline and bucket sizes.

    python -m slurmddp scale exp.yaml --nodes 1,2,3 [--ranks-per-node R] [--mode weak|strong]
                                      [--steps N] [--bucket-cap-mb 5,25,100] [KEY=VALUE ...]

Weak scaling keeps each rank's batch (the global batch grows with the ranks), strong scaling keeps
the global batch (each rank's share shrinks). The global batch is a `train:` key of the experiment
(`--batch-key`, default `global_batch`), the value the code hands to `ctx.loader(global_batch=...)`.
Pure: the elements are override sets; submitting them is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import GLOBAL_BATCH, Experiment

Mode = Literal["weak", "strong"]
MODES: tuple[Mode, ...] = ("weak", "strong")
BATCH_KEY = GLOBAL_BATCH


@dataclass(frozen=True)
class Element:
    """One job of the study."""

    index: int
    role: str
    """`baseline` (1 rank), `size` (a requested node count), `bucket` (a bucket size at the largest)."""
    label: str
    nodes: int
    ranks: int
    bucket_cap_mb: float | None
    """The bucket size this element sets; None keeps the experiment's."""
    overrides: dict[str, Any]
    """Full config keys -> values, applied on top of the experiment and the user's overrides."""


@dataclass(frozen=True)
class Study:
    mode: Mode
    batch_key: str | None
    elements: tuple[Element, ...]


def numbers(text: str, option: str, kind: type[int] | type[float]) -> list[Any]:
    """`1,2,3` -> [1, 2, 3] (distinct, > 0), or a ConfigError naming `option`."""
    values: list[Any] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = kind(part)
        except ValueError:
            raise ConfigError(f"{option} {text}: {part!r} is not a number; give a list like 1,2,3") from None
        if value <= 0:
            raise ConfigError(f"{option} {text}: {part} is not positive")
        if value in values:
            raise ConfigError(f"{option} {text}: {part} is given twice")
        values.append(value)
    if not values:
        raise ConfigError(f"{option}: give at least one value, e.g. {option} 1,2")
    return values


def plan(
    exp: Experiment,
    *,
    nodes: list[int],
    ranks_per_node: int | None,
    mode: str,
    steps: int | None,
    batch_key: str | None,
    bucket_caps: list[float],
    cluster_nodes: int | None,
) -> Study:
    """The elements of the study, or a ConfigError that says what to change; nothing is submitted
    for a study with a bad value."""
    if mode not in MODES:
        raise ConfigError(f"--mode {mode}: must be weak or strong")
    if not nodes:
        raise ConfigError("--nodes: give the node counts to measure, e.g. --nodes 1,2,3")
    warmup = exp.telemetry.warmup_steps
    if steps is not None and steps <= warmup:
        raise ConfigError(
            f"--steps {steps}: the first {warmup} steps of a run are warm-up and not measured "
            f"(telemetry.warmup_steps); give more steps, 20 or more for steady figures"
        )
    if not exp.telemetry.enabled:
        raise ConfigError("scale reads what the loop measures: drop telemetry.enabled=false")
    per_node = ranks_per_node or exp.resources.ranks_per_node
    if cluster_nodes is not None and max(nodes) > cluster_nodes:
        where = exp.resources.partition or "the default partition"
        raise ConfigError(
            f"--nodes {','.join(map(str, nodes))}: {max(nodes)} nodes, but {where} has {cluster_nodes}; "
            f"measure at most {cluster_nodes} nodes (or name a larger resources.partition)"
        )
    key, batch = _batch(exp, batch_key)
    written = exp.resources.world_size
    sizes = sorted(nodes)
    counts = [1, *(n * per_node for n in sizes)]
    values = _batches(mode, key, batch, written, counts)
    common: dict[str, Any] = {} if steps is None else {"telemetry.max_steps": steps}
    ranks_key = "resources.gpus_per_node" if exp.resources.gpus_per_node else "resources.tasks_per_node"
    elements: list[Element] = []

    def add(role: str, label: str, nodes: int, per: int, cap: float | None) -> None:
        overrides = {"resources.nodes": nodes, ranks_key: per, **common}
        if cap is not None:
            overrides["ddp.bucket_cap_mb"] = cap
        if key is not None and values[nodes * per] is not None:
            overrides[key] = values[nodes * per]
        elements.append(Element(len(elements), role, label, nodes, nodes * per, cap, overrides))

    # With one rank per node, one node is the 1-rank baseline: it is not run twice.
    add("baseline", "1 node (baseline)" if per_node == 1 and 1 in sizes else "baseline", 1, 1, None)
    for n in sizes:
        if n * per_node > 1:
            add("size", _nodes(n), n, per_node, None)
    for cap in bucket_caps:
        add("bucket", f"{_nodes(sizes[-1])}, bucket {cap:g} MB", sizes[-1], per_node, cap)
    return Study(mode="weak" if mode == "weak" else "strong", batch_key=key, elements=tuple(elements))


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count > 1 else ''}"


def _batch(exp: Experiment, batch_key: str | None) -> tuple[str | None, int | None]:
    """The global batch's key and value; (None, None) when the experiment has none and no key was
    named (the study then changes only the ranks)."""
    name = batch_key or BATCH_KEY
    bare = name.removeprefix("train.")
    if bare not in exp.train:
        if batch_key is None:
            return None, None
        known = ", ".join(sorted(exp.train)) or "none"
        raise ConfigError(
            f"--batch-key {batch_key}: the experiment's train: has no {bare!r} (its keys: {known})"
        )
    value = exp.train[bare]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"train.{bare}: the global batch must be a positive integer, got {value!r}")
    return f"train.{bare}", value


def _batches(
    mode: str, key: str | None, batch: int | None, written: int, counts: list[int]
) -> dict[int, int | None]:
    """The global batch of each rank count: weak keeps `batch / written` per rank, strong keeps
    `batch`, split evenly."""
    if key is None or batch is None:
        if mode == "strong":
            raise ConfigError(
                "--mode strong keeps the global batch at every size: the experiment needs it as "
                f"train.{BATCH_KEY} (the value the code gives ctx.loader(global_batch=...)), or name its "
                "key with --batch-key"
            )
        return dict.fromkeys(counts)
    if mode == "weak":
        if batch % written:
            raise ConfigError(
                f"{key}={batch} does not split evenly over the experiment's {written} ranks, so weak "
                "scaling has no per-rank batch to keep; make it a multiple of the ranks"
            )
        return {count: batch // written * count for count in counts}
    uneven = sorted({count for count in counts if batch % count})
    if uneven:
        raise ConfigError(
            f"--mode strong keeps the global batch {key}={batch} at every size, and "
            f"{', '.join(map(str, uneven))} rank(s) cannot split it evenly; choose sizes whose rank "
            f"counts divide {batch}, change {key}, or use --mode weak"
        )
    return dict.fromkeys(counts, batch)
