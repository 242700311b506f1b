"""Telemetry on a CUDA GPU: the hook's CUDA events time an NCCL all-reduce, and the peak memory is
the device's."""

from __future__ import annotations

import pytest

from slurmddp.experiment import schema
from slurmddp.job.process.mpi import free_port
from slurmddp.job.train.telemetry import CommTimer, Telemetry, attach

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_cuda_events_time_each_bucket_and_the_peak_is_the_devices() -> None:
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device("cuda", 0)
    tdist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, device_id=device
    )
    try:
        model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(4))).to(device)
        ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=10)
        timer = CommTimer(device)
        assert attach([ddp], timer)
        for _ in range(3):
            ddp(torch.randn(64, 2048, device=device)).square().mean().backward()
            intervals = timer.take()
        # 4 x 16 MB of float32 gradients in 10 MB buckets: several, each timed by two events.
        assert len(intervals) == len(timer.bucket_bytes) > 1
        assert all(end >= start >= 0 for start, end in intervals)
        telemetry = Telemetry(
            schema.Telemetry(warmup_steps=0, every_s=1),
            rank=0,
            world_size=1,
            device=device,
            samples_per_step=64,
            backend="nccl",
            transport="auto",
            log=lambda step, **values: None,
        )
        telemetry.comm_measured = True
        telemetry.step(0.0, 0.01)
        telemetry.finish(1)
        assert telemetry.summary is not None
        (peak,) = telemetry.summary["peak_mem_bytes"]
        assert peak >= 4 * 2048 * 2048 * 4  # at least the weights
    finally:
        tdist.destroy_process_group()
