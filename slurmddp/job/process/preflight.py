"""The check every rank runs at job start: its device, then one all-reduce of a known tensor (is the
sum right, how fast was it) and one ring transfer between neighbouring ranks (which link is slow).

A broken or slow node then fails the job within seconds, by name, instead of hanging its peers in
the first training collective until the distributed timeout. The judgement (`verdict`) is a pure
function of what the ranks measured, and every rank reaches the same one from the same gathered
reports, so every rank raises the same error and none is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmddp.errors import PreflightError
from slurmddp.experiment.schema import Preflight
from slurmddp.job.process.distenv import DistEnv
from slurmddp.rundir.outputs import PreflightReport
from slurmddp.rundir.records import AttemptId, Failure

REPEATS = 8
"""Timed all-reduces after the first (the first also sets up connections, so it is not timed)."""
# Each rank contributes a small integer: float32 sums them exactly for any world size below 2**21,
# so the expected sum can be compared for equality, element by element.
_CONTRIBUTION_CYCLE = 7


@dataclass(frozen=True)
class RankReport:
    """What one rank saw."""

    rank: int
    host: str
    sum_ok: bool
    allreduce_s: float
    """Seconds per all-reduce, mean of the timed ones."""
    ring_from: int
    """The rank whose tensor this rank received in the ring transfer (itself in a 1-rank job)."""
    ring_s: float
    forced: bool = False
    """This host is named in preflight.fail_on_host."""


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    gbps: float


@dataclass(frozen=True)
class Verdict:
    ok: bool
    bus_gbps: float
    links: tuple[Link, ...]
    """Host-to-host transfers of the ring (those within a node are left out)."""
    message: str
    suspects: tuple[str, ...] = ()


def contribution(rank: int) -> float:
    return float(rank % _CONTRIBUTION_CYCLE + 1)


def expected_sum(world_size: int) -> float:
    return sum(contribution(rank) for rank in range(world_size))


def bus_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in Gb/s, as nccl-tests defines it: the data size over the time,
    times 2(n-1)/n, the share of the data each rank's link carries in a ring all-reduce."""
    if world_size < 2 or seconds <= 0:
        return 0.0
    return nbytes * 8 / seconds / 1e9 * 2 * (world_size - 1) / world_size


def check_device(dist: DistEnv, host: str, run_dir: Path) -> None:
    """Before the process group: a GPU rank must see CUDA and the device it was given (a CPU rank
    has nothing to check). On a failure this rank ends at once; srun's --kill-on-bad-exit then ends
    its peers, which are waiting for it in the rendezvous."""
    if dist.device_index is None:
        return
    import torch

    problem = device_problem(
        dist.device_index, torch.cuda.device_count() if torch.cuda.is_available() else 0, host, dist.rank
    )
    if problem is not None:
        raise _fail(dist, run_dir, problem, (host,))


def device_problem(device_index: int, visible: int, host: str, rank: int) -> str | None:
    """What is wrong with a GPU rank that should drive cuda:`device_index` and sees `visible`."""
    if visible == 0:
        return (
            f"{host}: rank {rank} was given GPUs by Slurm (CUDA_VISIBLE_DEVICES) but torch sees no CUDA "
            f"device: a CPU-only torch build, or a broken driver on {host}; fix it or exclude the node "
            f"(resources.exclude={host})"
        )
    if device_index >= visible:
        return (
            f"{host}: rank {rank} should drive cuda:{device_index} but torch sees {visible} device(s) "
            f"there; check CUDA_VISIBLE_DEVICES and the node's GPUs, or exclude it (resources.exclude={host})"
        )
    return None


def verdict(reports: Sequence[RankReport], settings: Preflight, nbytes: int, num_nodes: int) -> Verdict:
    """Judge the gathered reports (the same on every rank)."""
    world = len(reports)
    slowest = max((r.allreduce_s for r in reports), default=0.0)
    bus = bus_gbps(nbytes, slowest, world)
    links = _ring_links(reports, nbytes)
    summary = _summary(nbytes, world, num_nodes, bus, links)
    forced = sorted({r.host for r in reports if r.forced})
    if forced:
        return Verdict(
            False,
            bus,
            links,
            f"{', '.join(forced)}: failed on purpose (preflight.fail_on_host={settings.fail_on_host}); "
            f"{summary}. Unset preflight.fail_on_host to run",
            tuple(forced),
        )
    wrong = [r for r in reports if not r.sum_ok]
    if wrong:
        hosts = sorted({r.host for r in wrong})
        where = "every rank" if len(wrong) == world else f"ranks {', '.join(str(r.rank) for r in wrong)}"
        return Verdict(
            False,
            bus,
            links,
            f"{', '.join(hosts)}: the all-reduce returned a wrong sum on {where} (expected "
            f"{expected_sum(world):g} in every element); a node's memory, device or network corrupts "
            f"data: exclude it (resources.exclude=...) and report it to the cluster admins",
            tuple(hosts),
        )
    floor = settings.min_bus_gbps
    if floor > 0 and world > 1 and bus < floor:
        suspects = slow_hosts(links, floor)
        named = ", ".join(suspects) if suspects else "no single node"
        return Verdict(
            False,
            bus,
            links,
            f"{named}: all-reduce bus bandwidth {bus:.2f} Gb/s is below preflight.min_bus_gbps={floor:g} "
            f"({summary}); exclude the slow node (resources.exclude=HOST), or lower or zero "
            "preflight.min_bus_gbps",
            tuple(suspects),
        )
    return Verdict(True, bus, links, summary)


def _ring_links(reports: Sequence[RankReport], nbytes: int) -> tuple[Link, ...]:
    """The ring transfers between two hosts, each in Gb/s (those within a node are left out)."""
    host_of = {r.rank: r.host for r in reports}
    return tuple(
        Link(host_of[r.ring_from], r.host, nbytes * 8 / r.ring_s / 1e9 if r.ring_s > 0 else 0.0)
        for r in reports
        if host_of[r.ring_from] != r.host
    )


def _summary(nbytes: int, world: int, num_nodes: int, bus: float, links: Sequence[Link]) -> str:
    """One line of what was measured: the all-reduce's size and bus bandwidth, each link's speed."""
    size = f"{nbytes / 2**20:g} MB over {world} ranks on {num_nodes} node(s)"
    shown = "; ".join(f"{link.src}->{link.dst} {link.gbps:.2f} Gb/s" for link in links)
    return f"all-reduce of {size}: bus {bus:.2f} Gb/s" + (f"; ring {shown}" if shown else "")


def slow_hosts(links: Sequence[Link], floor: float) -> list[str]:
    """The hosts to blame for slow links: a host on two or more slow links (its own network is the
    common factor); else both ends of the slowest link (with two nodes the two cannot be told apart)."""
    slow = [link for link in links if link.gbps < floor] or sorted(links, key=lambda link: link.gbps)[:1]
    counts: dict[str, int] = {}
    for link in slow:
        for host in {link.src, link.dst}:
            counts[host] = counts.get(host, 0) + 1
    common = sorted(host for host, count in counts.items() if count >= 2)
    if common and len(common) < len(counts):
        return common
    slowest = min(slow, key=lambda link: link.gbps, default=None)
    return sorted({slowest.src, slowest.dst}) if slowest else []


def run(settings: Preflight, dist: DistEnv, device: Any, host: str, run_dir: Path) -> Verdict:
    """Measure on this rank, gather every rank's report, judge; raise PreflightError on a failure.
    Collective: every rank of the default process group must call it."""
    import torch.distributed as tdist

    began = time.perf_counter()
    count = max(1, int(settings.size_mb * 2**20) // 4)
    nbytes = count * 4
    try:
        report = _measure(settings, dist, device, host, count)
        gathered: list[Any] = [None] * dist.world_size
        tdist.all_gather_object(gathered, report)
    except (RuntimeError, ValueError) as exc:
        # A peer that died or hung up: gloo names its address ("Connection closed by peer [ip]:port").
        raise _fail(
            dist, run_dir, f"{host}: rank {dist.rank}: the preflight all-reduce failed: {exc}"
        ) from None
    result = verdict(gathered, settings, nbytes, dist.num_nodes)
    if dist.rank == 0:
        PreflightReport(
            ok=result.ok,
            message=result.message,
            bus_gbps=result.bus_gbps,
            nbytes=nbytes,
            repeats=REPEATS,
            seconds=time.perf_counter() - began,
            suspects=list(result.suspects),
            links=[asdict(link) for link in result.links],
            ranks=[asdict(r) for r in gathered],
        ).write(run_dir)
    if not result.ok:
        raise _fail(dist, run_dir, f"preflight failed: {result.message}", result.suspects)
    if dist.rank == 0:
        print(f"slurmddp: preflight ok in {time.perf_counter() - began:.2f} s: {result.message}", flush=True)
    return result


def _measure(settings: Preflight, dist: DistEnv, device: Any, host: str, count: int) -> RankReport:
    """This rank's report: one checked all-reduce of `count` float32s, REPEATS timed ones, and one
    ring transfer. Collective, as `run` is."""
    import torch
    import torch.distributed as tdist

    world = dist.world_size
    data = torch.full((count,), contribution(dist.rank), dtype=torch.float32, device=device)
    tdist.all_reduce(data)
    sum_ok = bool(torch.all(data == expected_sum(world)).item())
    _sync(device)
    tdist.barrier()
    started = time.perf_counter()
    for _ in range(REPEATS):
        tdist.all_reduce(data)
    _sync(device)
    allreduce_s = (time.perf_counter() - started) / REPEATS
    ring_from, ring_s = _ring(dist.rank, world, data, device)
    return RankReport(
        dist.rank,
        host,
        sum_ok,
        allreduce_s,
        ring_from,
        ring_s,
        forced=settings.fail_on_host == host,
    )


def _ring(rank: int, world: int, data: Any, device: Any) -> tuple[int, float]:
    """Send to the next rank while receiving from the previous one; seconds until the data from the
    previous one is in: that link's time, not this rank's own sending (a slow link out of this node
    would otherwise be blamed on the link into it)."""
    if world < 2:
        return rank, 0.0
    import torch
    import torch.distributed as tdist

    incoming = torch.empty_like(data)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    started = time.perf_counter()
    requests = tdist.batch_isend_irecv(
        [tdist.P2POp(tdist.isend, data, nxt), tdist.P2POp(tdist.irecv, incoming, prev)]
    )
    # The receive is the last request (NCCL coalesces both into one, which then times both).
    requests[-1].wait()
    _sync(device)
    received = time.perf_counter() - started
    for request in requests[:-1]:
        request.wait()
    return prev, received


def _sync(device: Any) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _fail(dist: DistEnv, run_dir: Path, message: str, hosts: Sequence[str] = ()) -> PreflightError:
    # A broken node stays broken: requeueing onto it would fail the same way, so the requeue
    # decision retries only without the nodes named here (bad_hosts), and not at all when none is.
    # Every failing rank writes it (atomically): a rank that fails alone is the only one that can.
    failure = Failure(
        step=None,
        rank=dist.rank,
        error=message,
        attempt=AttemptId.of(dist),
        time=time.time(),
        bad_hosts={host: message for host in hosts},
        retry=False,
    )
    with contextlib.suppress(OSError):
        failure.write(run_dir, replace=True)
    print(f"slurmddp: {message}", flush=True)
    return PreflightError(message)
