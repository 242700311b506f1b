"""Resources that the login-node commands set themselves on a loaded experiment: the hosts a
resubmission goes on leaving out, the job a study element waits for.

Set on the typed values, not written as an override and loaded again; the run directory still
reads as if the override had been given: config.yaml (the resolved mapping) holds the value and the
manifest's overrides list it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from slurmddp.experiment.load import Loaded
from slurmddp.experiment.schema import Resources


def with_exclude(loaded: Loaded, hosts: Sequence[str]) -> Loaded:
    """`loaded` leaving out `hosts` (resources.exclude, a comma-separated list of them; unset
    when there are none)."""
    exclude = ",".join(hosts) or None
    return _with_resources(loaded, f"resources.exclude={exclude or 'null'}", exclude=exclude)


def with_dependency(loaded: Loaded, dependency: str) -> Loaded:
    """`loaded` with sbatch's --dependency (`afterany:JOBID`) among its other sbatch options."""
    sbatch = {**loaded.experiment.resources.sbatch, "dependency": dependency}
    return _with_resources(loaded, f"resources.sbatch.dependency={dependency}", sbatch=sbatch)


def _with_resources(loaded: Loaded, override: str, **values: Any) -> Loaded:
    # replace() runs Resources.__post_init__ again: the new values are checked as an override's are.
    resources: Resources = dataclasses.replace(loaded.experiment.resources, **values)
    return dataclasses.replace(
        loaded,
        experiment=dataclasses.replace(loaded.experiment, resources=resources),
        resolved={**loaded.resolved, "resources": {**loaded.resolved["resources"], **values}},
        overrides=(*loaded.overrides, override),
    )
