"""The fault campaign in CI: fixed seeds on the 24.11 lab only (one generation: each faulted run
takes about a minute). Every run ends COMPLETED with the uninterrupted run's parameters, bit for
bit, or, where no tool can survive the fault, with a final reason that names it; and no checkpoint
that was complete is lost but by keep_last pruning. Longer campaigns run by hand (campaign.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from campaign import campaign, line, table
from conftest import Labs, lab_generations

pytestmark = pytest.mark.slurm

GENERATION = "24.11"
SEED, TRIALS = 951, 3
"""Chosen for the kinds its first trials cover (KINDS): the Slurm daemons that no other lab test
takes down. Preemption, a killed rank and a dead node's ranks are tested in
tests/job/test_resume_cluster.py and test_node_loss_cluster.py."""
KINDS = ["slurmctld-running", "slurmd-restart", "slurmctld-pending"]


def test_fixed_seeds_survive_bit_identical_or_name_the_fault(
    labs: Labs, own_user_state: dict[str, str], tmp_path: Path
) -> None:
    if GENERATION not in lab_generations():
        pytest.skip(f"the campaign runs on the Slurm {GENERATION} lab only")
    env = {**labs.env(GENERATION), **own_user_state}
    outcomes = campaign(env, tmp_path, SEED, TRIALS)
    print(table(outcomes))
    assert [o.fault for o in outcomes] == KINDS, "the schedule of the seed changed: choose the seed again"
    # A fault the driver could not land in time (the run ended first, on a machine busy with other
    # labs) tests nothing, but its run must still end exact; one such miss of three is tolerated.
    missed = [o for o in outcomes if o.note.startswith("missed")]
    failed = [line(o) for o in outcomes if not o.passed and o not in missed]
    assert not failed, "\n".join(failed)
    assert all(o.bit_identical and not o.lost for o in missed), "\n".join(line(o) for o in missed)
    assert len(missed) <= 1, "\n".join(line(o) for o in missed)
