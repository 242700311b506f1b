"""What `resubmit RUN KEY=VALUE ...` may change in a run that resumes in its own directory, and how
ddp.accumulate follows a change in the number of ranks. Pure: the saved and the new resolved
configs in, the changed keys (or a refusal) out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slurmddp.errors import ConfigError

MAY_CHANGE = (
    "resources",
    "dist",
    "requeue",
    "fabric",
    "preflight",
    "telemetry",
    "checkpoint.every_steps",
    "checkpoint.every_minutes",
    "checkpoint.keep_last",
    "checkpoint.async_save",
    "ddp.accumulate",
    "ddp.bucket_cap_mb",
)
"""Where the run is placed and how it is kept going; not what it trains (train, precision, the
entrypoint, the rest of ddp) nor where it lives (name, output_dir, checkpoint.dir): a resumed run
with those changed would not continue the same training. The accumulation and the buckets change
only the order in which the same gradients are summed."""


def changed_keys(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two resolved configs, leaves only."""
    changed = []
    for key in sorted({*before, *after}, key=str):
        path = f"{prefix}{key}"
        old, new = before.get(key), after.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping) and old and new:
            changed += changed_keys(old, new, f"{path}.")
        elif old != new:
            changed.append(path)
    return changed


def check_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The keys a resubmission changes; a ConfigError naming the first one it may not change."""
    changed = changed_keys(before, after)
    for key in changed:
        if not any(key == allowed or key.startswith(f"{allowed}.") for allowed in MAY_CHANGE):
            raise ConfigError(
                f"resubmit cannot change {key} ({value_at(before, key)!r} -> "
                f"{value_at(after, key)!r}): the run resumes from its checkpoints and must go on "
                "training the same thing. It may change resources.*, dist.*, requeue.*, fabric.*, "
                "preflight.*, telemetry.*, checkpoint.every_steps/every_minutes/keep_last/async_save, "
                "ddp.accumulate and ddp.bucket_cap_mb; submit the experiment again for a new run"
            )
    return changed


def value_at(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted `key`, None where a part is missing."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def accumulate_for(accumulate: int, ranks_before: int, ranks_after: int, global_batch: int | None) -> int:
    """ddp.accumulate for `ranks_after` ranks that keeps each rank's micro-batch no larger than it
    was with `ranks_before`: the global batch is fixed, so fewer ranks take larger shares, cut into
    more micro-batches (2 ranks x 1 -> 1 rank x 2); more ranks need fewer. With the run's global
    batch known (ctx.loader's), the smallest such count that cuts each share evenly; a ConfigError
    if the new number of ranks cannot share it."""
    wanted = max(1, math.ceil(accumulate * ranks_before / ranks_after))
    if global_batch is None:
        return wanted
    if global_batch % ranks_after:
        raise ConfigError(
            f"the run's global batch of {global_batch} samples cannot be split evenly over "
            f"{ranks_after} ranks; choose resources.nodes and resources.tasks_per_node so that it can"
        )
    share = global_batch // ranks_after
    return next((n for n in range(wanted, share + 1) if share % n == 0), share)
