"""What `doctor` prints of the cluster checks, from a fake cluster (no Slurm needed)."""

from __future__ import annotations

import io

import pytest
from slurm_samples import LAB

from slurmddp.cli import doctor_cmd
from slurmddp.cluster.checks import examine, failed
from slurmddp.errors import SlurmCommandError


@pytest.mark.process  # version() asks the Slurm on this machine
def test_examine_prints_every_check_from_a_fake_cluster() -> None:
    def which(tool: str) -> str | None:
        return f"/opt/slurm/bin/{tool}"

    def show_config() -> str:
        return LAB.replace("= REQUEUE", "= CANCEL")

    found = examine(which=which, show_config=show_config, srun_help=lambda: "")
    out = io.StringIO()
    doctor_cmd.show(out, found)
    text = out.getvalue()
    assert text.startswith("slurmddp doctor: Slurm 22.05.8, cluster slurmddp\n")
    assert "  OK    container: pyxis" in text and "absent" in text
    assert "  WARN  PreemptMode/PreemptType" in text and "/opt/slurm/bin/sacct" in text
    assert not failed(found.checks)


def test_a_controller_that_does_not_answer_fails_and_points_to_the_local_executor() -> None:
    def show_config() -> str:
        raise SlurmCommandError(
            "scontrol show config: scontrol: error: fetch_config: DNS SRV lookup failed\n"
            "scontrol: fatal: Could not establish a configuration source"
        )

    found = examine(which=lambda tool: f"/usr/bin/{tool}", show_config=show_config)
    out = io.StringIO()
    doctor_cmd.show(out, found)
    lines = out.getvalue().splitlines()
    assert failed(found.checks)
    assert lines[-2].split() == [
        *("FAIL", "scontrol", "show", "config", "scontrol:", "fatal:", "Could", "not", "establish", "a"),
        *("configuration", "source"),
    ]
    assert lines[-1].strip() == (
        "cannot reach slurmctld: check SLURM_CONF; to train on this machine meanwhile, submit with "
        "executor=local"
    )
