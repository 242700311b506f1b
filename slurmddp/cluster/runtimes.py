"""Which container runtimes this cluster offers the ranks, as seen from the login node:
- pyxis: its SPANK plugin adds --container-image to srun (srun reads plugstack.conf, so
  `srun --help` lists pyxis's options where the plugin is configured);
- Apptainer: `apptainer` (or its older name `singularity`) on PATH; the nodes are taken to match
  the login node;
- Slurm's own OCI support: oci.conf beside slurm.conf (`scontrol show config` names SLURM_CONF).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slurmddp.errors import SubmitError

Runtime = Literal["pyxis", "apptainer", "oci"]
RUNTIMES: tuple[Runtime, ...] = ("pyxis", "apptainer", "oci")
PYXIS_OPTION = "--container-image"
APPTAINER_COMMANDS = ("apptainer", "singularity")
OCI_CONF = "oci.conf"


@dataclass(frozen=True)
class Offered:
    """What was found for each runtime: where it was found, or None and why not."""

    found: Mapping[Runtime, str | None]
    why_not: Mapping[Runtime, str]

    def require(self, runtime: Runtime) -> None:
        """Refuse, before anything is submitted, a runtime the cluster does not offer."""
        if self.found.get(runtime) is None:
            others = [name for name in RUNTIMES if self.found.get(name) is not None]
            instead = f"; this cluster offers {', '.join(others)}" if others else "; it offers none"
            raise SubmitError(
                f"container.runtime: {runtime} is not offered here ({self.why_not[runtime]}){instead}: "
                "nothing was submitted. Use an image for a runtime the cluster has (python -m slurmddp "
                "doctor lists them), or run without container.image"
            )


def offered(
    srun_help: Callable[[], str],
    config: Mapping[str, str] | None,
    which: Callable[[str], str | None] = shutil.which,
) -> Offered:
    """The runtimes found, from `srun --help`'s text, slurmctld's settings (None: unknown) and PATH."""
    found: dict[Runtime, str | None] = {}
    why_not: dict[Runtime, str] = {}
    helped = srun_help() if which("srun") else ""
    found["pyxis"] = "srun --help lists --container-image" if PYXIS_OPTION in helped else None
    why_not["pyxis"] = f"srun --help lists no {PYXIS_OPTION}: the pyxis SPANK plugin is not configured"
    commands = [path for name in APPTAINER_COMMANDS if (path := which(name))]
    found["apptainer"] = commands[0] if commands else None
    why_not["apptainer"] = f"neither {' nor '.join(APPTAINER_COMMANDS)} is on PATH"
    conf = (config or {}).get("SLURM_CONF")
    oci = Path(conf).parent / OCI_CONF if conf else None
    found["oci"] = str(oci) if oci is not None and oci.is_file() else None
    why_not["oci"] = (
        f"no {oci} beside slurm.conf: Slurm's OCI support is not configured"
        if oci is not None
        else "slurmctld's settings name no SLURM_CONF, so oci.conf cannot be looked for"
    )
    return Offered(found, why_not)


def apptainer_command(which: Callable[[str], str | None] = shutil.which) -> str:
    """The name Apptainer goes by here: `singularity` where only that is on PATH (releases before
    the rename), else `apptainer`."""
    return next((name for name in APPTAINER_COMMANDS if which(name)), APPTAINER_COMMANDS[0])


def srun_help() -> str:
    """`srun --help`'s text; empty where srun cannot say it."""
    try:
        proc = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr
