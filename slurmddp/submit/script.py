"""The batch script: slurmddp's setup and teardown lines (Jinja templates in batch/ beside this module) and
the whole script as submitit writes it."""

from __future__ import annotations

import shlex
from typing import Any

import jinja2
from submitit.slurm.slurm import _make_sbatch_string

from slurmddp.defaults import (
    EXIT_FINISHED,
    EXIT_RESTART_IN_JOB,
    IN_JOB_RESTART_ENV,
    RESIDENT_ENV,
    RESIDENT_IMPORT_ENV,
    SLURMD_PORT_ENV,
    SNAPSHOTS_ENV,
    STOP_SIGNALS_ENV,
)

BOOT_MODULE = "slurmddp.job.launch.boot"
"""What each task runs first (`python -u -m BOOT_MODULE -u -m submitit.core._submit FOLDER`)."""
ATTEMPTS_MODULE = "slurmddp.job.allocation.attempts"
"""What the batch script runs before and after srun to record the attempt and requeue it."""
STEPWATCH_MODULE = "slurmddp.job.allocation.stepwatch"
"""What the batch script runs beside srun to end a step whose node went silent."""


def render_template(template: str, **values: Any) -> str:
    """Render one of the templates; `| q` shell-quotes a value. The constants the script shares
    with Python (module names, the exit status of a finished run) are passed in from here."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("slurmddp.submit", "batch"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,
    )
    environment.filters["q"] = lambda value: shlex.quote(str(value))
    return environment.get_template(template).render(
        attempts_module=ATTEMPTS_MODULE,
        stepwatch_module=STEPWATCH_MODULE,
        slurmd_port_env=SLURMD_PORT_ENV,
        exit_finished=EXIT_FINISHED,
        exit_restart_in_job=EXIT_RESTART_IN_JOB,
        in_job_restart_env=IN_JOB_RESTART_ENV,
        resident_env=RESIDENT_ENV,
        resident_import_env=RESIDENT_IMPORT_ENV,
        stop_signals_env=STOP_SIGNALS_ENV,
        snapshots_env=SNAPSHOTS_ENV,
        **values,
    )


def sbatch_script(command: str, folder: Any, parameters: dict[str, Any], array_size: int) -> str:
    """The batch script submitit writes for these executor parameters, byte for byte."""
    # submitit's own renderer (module-level, underscore-named): rendering it ourselves would drift
    # from what submitit submits; the cluster tests compare it with a submitted script.
    parameters = dict(parameters)
    if array_size > 1:
        # submitit adds this itself when it submits a batch of more than one job as an array.
        parameters["map_count"] = array_size
    return str(_make_sbatch_string(command=command, folder=folder, **parameters))
