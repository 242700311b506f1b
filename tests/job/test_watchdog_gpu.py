"""The watchdog on a CUDA GPU: an NCCL rank that stalls leaves its flight recorder next to its stacks."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest
from dist_envs import dist_env

from slurmddp.job.process import rendezvous, watchdog

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_stalled_nccl_rank_dumps_its_flight_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as tdist

    # The recorder keeps entries only with a buffer; torch reads this when the process group starts.
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "100")
    dist = dist_env(master_addr="127.0.0.1", master_port=29533, job_id="3", device_index=0)
    store = rendezvous.open_store(dist, 30)
    tdist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    fired = threading.Event()
    exits: list[int] = []

    def exit_(status: int) -> None:
        exits.append(status)
        fired.set()

    dog = watchdog.Watchdog(tmp_path, dist, 1, exit=exit_)
    try:
        for step in range(3):
            dog.at(step)
            tensor = torch.ones(1024, device="cuda")
            tdist.all_reduce(tensor)
            torch.cuda.synchronize()
        assert fired.wait(30)
    finally:
        dog.stop()
        tdist.destroy_process_group()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    folder = tmp_path / "hangs" / "3.0"
    trace = pickle.loads((folder / "rank_0.nccl_trace").read_bytes())
    entries = trace["entries"]
    assert [e["profiling_name"] for e in entries].count("nccl:all_reduce") == 3, entries
    assert "test_watchdog_gpu.py" in (folder / "rank_0.stacks.txt").read_text()
    assert os.path.getsize(folder / "rank_0.json") > 0
