"""What `doctor` prints of the cluster checks, from a fake cluster (no Slurm needed)."""

from __future__ import annotations

import io

import pytest
from slurm_samples import LAB

from slurmddp.cli import doctor_cmd
from slurmddp.cluster.checks import examine, failed


@pytest.mark.process  # version() asks the Slurm on this machine
def test_examine_prints_every_check_from_a_fake_cluster() -> None:
    def which(tool: str) -> str | None:
        return f"/opt/slurm/bin/{tool}"

    def show_config() -> str:
        return LAB.replace("= REQUEUE", "= CANCEL")

    found = examine(which=which, show_config=show_config)
    out = io.StringIO()
    doctor_cmd.show(out, found)
    text = out.getvalue()
    assert text.startswith("slurmddp doctor: Slurm 22.05.8, cluster slurmddp\n")
    assert "  WARN  PreemptMode/PreemptType" in text and "/opt/slurm/bin/sacct" in text
    assert not failed(found.checks)
