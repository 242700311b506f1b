"""resources.replace_slow_nodes without a cluster: what it needs, refused with why; and the loop's
end for it, whose record the requeue rules turn into a restart on a spare from that checkpoint.
The lab test is tests/job/test_slow_node_cluster.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed

from slurmddp.errors import ConfigError
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Checkpoint, Ddp, Precision, Requeue, Resources
from slurmddp.job.allocation import outcome, requeue
from slurmddp.job.checkpoint import CheckpointStore
from slurmddp.job.train.loop import LoopRuntime, LoopState, SlowNodeReplaced, TrainLoop
from slurmddp.rundir.records import AttemptId, Failure

ONE_RANK = SimpleNamespace(rank=0, job_id="1", restart_count=0, in_job_restart=0)
WHY = "slow: 2.10x the median node's compute per step"


def experiment(tmp_path: Path, entrypoint: str, *overrides: str) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(f"entrypoint: {entrypoint}\nresources:\n  nodes: 2\n  replace_slow_nodes: true\n")
    load_experiment(path, list(overrides))


def test_it_needs_a_spare_the_telemetry_and_a_function_entrypoint(tmp_path: Path) -> None:
    experiment(tmp_path, "pkg.train:main", "resources.spare_nodes=1")
    with pytest.raises(ConfigError) as refused:
        experiment(tmp_path, "pkg.train:main")
    assert str(refused.value) == f"{tmp_path / 'exp.yaml'}: " + (
        "resources.replace_slow_nodes: needs a spare (resources.spare_nodes=1 or more); "
        "add them or set it to false"
    )
    with pytest.raises(ConfigError) as refused:
        experiment(tmp_path, "train.py", "resources.spare_nodes=1", "telemetry.enabled=false")
    # The error names the override that made the experiment what it is.
    assert str(refused.value) == "override 'telemetry.enabled=false': " + (
        "resources.replace_slow_nodes: needs the telemetry that names the node (telemetry.enabled=true) "
        "and a function entrypoint, whose ctx.loop takes the measures; add them or set it to false"
    )


def loop_replacing(run_dir: Path, slow: dict[str, str] | None) -> TrainLoop:
    checkpoint = Checkpoint()
    store = CheckpointStore(run_dir / "checkpoints", rank=0, world_size=1, settings=checkpoint, attempt="1-0")
    return TrainLoop(
        10,
        checkpoint=checkpoint,
        ddp=Ddp(),
        precision=Precision(),
        state=LoopState({"model": torch.nn.Linear(2, 2)}),
        runtime=LoopRuntime(
            dist=ONE_RANK,
            device=torch.device("cpu"),
            run_dir=run_dir,
            store=store,
            slow_to_replace=lambda: slow,
        ),
    )


def test_the_ranks_end_after_the_checkpoint_and_restart_on_the_spare_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    barriers: list[int] = []
    monkeypatch.setattr(torch.distributed, "barrier", lambda: barriers.append(1))
    loop = loop_replacing(tmp_path, {"node2": WHY})
    loop.step = 4
    loop.save()
    with pytest.raises(SlowNodeReplaced, match="after the checkpoint at step 4 to replace a slow node"):
        loop._end_for_replacement()
    assert barriers == [1]
    assert (tmp_path / "checkpoints" / "step-00000004").is_dir()
    failure = Failure.read_for(tmp_path, AttemptId("1", 0))
    assert failure is not None and failure.step == 4 and failure.suspect_hosts == {"node2": WHY}
    decision = requeue.decide(
        tmp_path,
        1,
        {"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-3]"},
        outcome.Settings(Requeue(), Resources(nodes=2, spare_nodes=1, replace_slow_nodes=True)),
        preempt_time=lambda job: None,
        failed_nodes=lambda nodes, since: {},
    )
    assert (decision.in_job, decision.step, decision.leave_out, decision.set_aside) == (
        True,
        4,
        {},
        {"node2": WHY},
    )
    assert decision.message.startswith(f"failure at step 4 (node2: {WHY}); leaving out node2")


def test_a_checkpoint_not_saved_waits_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "barrier", lambda: pytest.fail("no barrier without a save"))
    loop = loop_replacing(tmp_path, {"node2": WHY})
    loop.step = 4
    # No save at this step (it was skipped): the ranks go on.
    loop._end_for_replacement()
    assert Failure.read_for(tmp_path, AttemptId("1", 0)) is None
