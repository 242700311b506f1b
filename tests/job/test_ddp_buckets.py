"""A script's later attempt builds its DDP in the layout the first attempt's DDP rebuilt to
(job/script/ddp_buckets.py): recorded once DDP rebuilt, replayed only onto the same shapes."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from slurmddp.job.script import ddp_buckets  # noqa: E402

ORIGINAL_INIT = nn.parallel.DistributedDataParallel.__init__


def install(run_dir: Path, rank: int = 0) -> None:
    """install() as a new attempt's process runs it: onto DDP's own __init__."""
    nn.parallel.DistributedDataParallel.__init__ = ORIGINAL_INIT  # type: ignore[method-assign]
    ddp_buckets.install(run_dir, rank)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import torch.distributed as dist

    # install() patches the class; each test gets the original back.
    monkeypatch.setattr(nn.parallel.DistributedDataParallel, "__init__", ORIGINAL_INIT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model(last: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.Linear(16, last))


def layout(ddp: Any) -> list[list[tuple[int, ...]]]:
    return [
        [tuple(t.shape) for t in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()
    ]


def train(ddp: Any, steps: int) -> None:
    for _ in range(steps):
        ddp(torch.randn(4, 64)).sum().backward()


def test_the_rebuilt_layout_is_recorded_and_replayed(tmp_path: Path, one_rank: None) -> None:
    install(tmp_path)
    first = nn.parallel.DistributedDataParallel(model())
    initial = layout(first)
    train(first, 1)
    assert not (tmp_path / "ddp" / "0.json").exists(), "recorded before DDP rebuilt"
    train(first, 2)
    rebuilt = layout(first)
    assert rebuilt != initial, "this model's rebuild must change the layout, or the test proves nothing"
    assert json.loads((tmp_path / "ddp" / "0.json").read_text())["buckets"]

    install(tmp_path)  # a later attempt's process
    again = nn.parallel.DistributedDataParallel(model())
    assert layout(again) == rebuilt
    train(again, 3)
    assert layout(again) == rebuilt


def test_a_record_is_not_replayed_onto_other_shapes(tmp_path: Path, one_rank: None) -> None:
    install(tmp_path)
    train(nn.parallel.DistributedDataParallel(model()), 2)
    install(tmp_path)
    other = nn.parallel.DistributedDataParallel(model(last=3))
    assert layout(other) == layout(nn.parallel.DistributedDataParallel(model(last=3))), "replayed anyway"


def test_only_rank_0_records(tmp_path: Path, one_rank: None) -> None:
    install(tmp_path, rank=1)
    train(nn.parallel.DistributedDataParallel(model()), 3)
    assert not (tmp_path / "ddp").exists()
