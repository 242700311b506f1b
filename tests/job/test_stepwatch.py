"""job/allocation/stepwatch.py: the batch script's watch ends srun once the attempt's failure names a bad host
(a node srun would wait for until Slurm calls it down), and leaves an srun that ends by itself
alone. A real process stands for srun."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from slurmddp.job.allocation import stepwatch
from slurmddp.rundir.records import AttemptId, Failure

ME = AttemptId("7", 0, 1)


def test_srun_is_ended_once_the_failure_names_a_bad_host(tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "60"])
    said: list[str | None] = []
    watching = threading.Thread(target=lambda: said.append(stepwatch.watch(tmp_path, srun.pid, ME, 0.02)))
    watching.start()
    time.sleep(0.2)
    # An earlier attempt's record names a host too: not this attempt's, so nothing happens.
    Failure(
        3, 2, "node9 stopped answering", AttemptId("7", 0, 0), time.time(), bad_hosts={"node9": "x"}
    ).write(tmp_path)
    time.sleep(stepwatch.STEP_END_GRACE_S + 0.3)
    assert srun.poll() is None
    named = time.monotonic()
    Failure(5, 2, "node2 stopped answering", ME, time.time(), bad_hosts={"node2": "silent"}).write(tmp_path)
    assert srun.wait(10) == -9
    watching.join(10)
    assert time.monotonic() - named >= stepwatch.STEP_END_GRACE_S
    assert said and said[0] is not None and "node2" in said[0], said


def test_an_srun_that_ends_by_itself_is_left_alone(tmp_path: Path) -> None:
    srun = subprocess.Popen(["sleep", "0.5"])
    Failure(5, 1, "ValueError('bad batch')", ME, time.time()).write(tmp_path)  # no host to blame
    watching = threading.Thread(target=lambda: stepwatch.watch(tmp_path, srun.pid, ME, 0.02))
    watching.start()
    assert srun.wait(10) == 0
    watching.join(10)
    assert not watching.is_alive()
