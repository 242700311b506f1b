"""A scaling study's finished elements -> rows of numbers and verdicts in words (what they look like
as a table, CSV and PNG: manage/scaling_report.py).

The study runs one experiment at several sizes plus a 1-rank baseline (and optionally several DDP
bucket sizes at the largest size). Each size is compared with the baseline, and a size that falls
short is explained by what its telemetry and its preflight show. Plain values in, text out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmddp.errors import SlurmddpError
from slurmddp.job.process.preflight import Link, slow_hosts
from slurmddp.manage.numbers import rate
from slurmddp.rundir.outputs import PreflightReport

EFFICIENCY_FLOOR = 0.90
"""A size below this share of the ideal speedup is flagged."""
COMM_CEILING = 0.10
"""A size whose communication is exposed (not hidden behind compute) for more of the step is flagged."""
DATA_CEILING = 0.10
"""Waiting for the next batch longer than this share of the step is named as a cause."""
LATENCY_BOUND = 4
"""A bucket whose all-reduce takes under this many barrier latencies pays mostly latency."""
SLOW_LINK = 0.5
"""A preflight link slower than this share of the fastest link is named as slow."""
COMPUTE_SLACK = 1.2
"""A rank's compute (step time less data wait and exposed communication) this much above what the
baseline's predicts is named: the ranks are slower at computing, not at talking."""
MODES = ("weak", "strong")
COMPLETED = "COMPLETED"
SCALING_NAMES = {
    "weak": "weak scaling (same batch per rank)",
    "strong": "strong scaling (same global batch)",
}
"""What each mode is called in verdicts and plot titles."""


@dataclass(frozen=True)
class Point:
    """One finished element of the study, as read back from its run directory."""

    index: int
    label: str
    """What the element is, e.g. "baseline", "2 nodes", "3 nodes, bucket 5 MB"."""
    nodes: int
    ranks: int
    """World size."""
    bucket_cap_mb: float | None
    """The DDP bucket size it ran with; None: the experiment's own."""
    state: str
    """Slurm's final state: "COMPLETED", "FAILED", ..."""
    telemetry: Mapping[str, Any] | None
    """result.json's "telemetry"; None where missing."""
    preflight: PreflightReport | None
    """The element's preflight.json; None where missing."""
    role: str
    """"baseline" (1 rank), "size" (a requested size) or "bucket" (a bucket size at the largest size)."""


@dataclass(frozen=True)
class Row:
    """One element's numbers; None where not measured (or not completed)."""

    index: int
    label: str
    role: str
    nodes: int
    ranks: int
    bucket_cap_mb: float | None
    state: str
    throughput: float | None
    """In the analysis's unit: samples/s or steps/s, all ranks together."""
    per_rank: float | None
    speedup: float | None
    """Throughput over the baseline's."""
    efficiency: float | None
    """Speedup over the ideal speedup (ranks over the baseline's ranks)."""
    step_s: float | None
    exposed_comm_frac: float | None
    data_wait_frac: float | None
    barrier_s: float | None


@dataclass(frozen=True)
class Analysis:
    mode: str
    unit: str
    """"samples/s", or "steps/s" where some element measured no samples."""
    rows: tuple[Row, ...]
    verdicts: tuple[str, ...]
    """A headline and one line per cause for each flagged size, one per element that was not measured,
    and an overall line last."""
    bucket_advice: str | None
    """Which bucket size to keep; None where the study tried none."""


def analyse(points: Sequence[Point], mode: str) -> Analysis:
    """Rows, verdicts and bucket advice for a study; `mode` ("weak" or "strong") only changes words."""
    if mode not in MODES:
        raise SlurmddpError(f"scaling mode {mode!r}: must be one of {', '.join(MODES)}")
    unit = _unit(points)
    baseline = next((p for p in points if p.role == "baseline"), None)
    base_x = None if baseline is None else _throughput(baseline, unit)
    base_ranks = baseline.ranks if baseline else 1
    rows = tuple(_row(p, unit, base_x, base_ranks) for p in points)
    alone = compute_s(baseline.telemetry) if baseline is not None and baseline.state == COMPLETED else None
    verdicts = [
        line
        for p, r in zip(points, rows, strict=True)
        for line in _point_verdicts(p, r, base_ranks, mode, alone)
    ]
    verdicts.append(_overall(rows, mode))
    return Analysis(mode, unit, rows, tuple(verdicts), _bucket_advice(rows, unit))


def _unit(points: Sequence[Point]) -> str:
    # One unit for every row, so that the ratios compare like with like: samples/s only where every
    # measured element counted samples (a loop without a data loader counts only steps).
    measured = [
        p
        for p in points
        if p.state == COMPLETED
        and (
            _value(p.telemetry, "samples_per_s") is not None or _value(p.telemetry, "steps_per_s") is not None
        )
    ]
    return (
        "samples/s" if all(_value(p.telemetry, "samples_per_s") is not None for p in measured) else "steps/s"
    )


def _throughput(point: Point, unit: str) -> float | None:
    if point.state != COMPLETED:
        return None
    return _value(point.telemetry, "samples_per_s" if unit == "samples/s" else "steps_per_s")


def _row(point: Point, unit: str, base_x: float | None, base_ranks: int) -> Row:
    done = point.state == COMPLETED
    telemetry = point.telemetry if done else None
    x = _throughput(point, unit)
    speedup = None if x is None or not base_x else x / base_x
    return Row(
        index=point.index,
        label=point.label,
        role=point.role,
        nodes=point.nodes,
        ranks=point.ranks,
        bucket_cap_mb=point.bucket_cap_mb,
        state=point.state,
        throughput=x,
        per_rank=None if x is None else x / point.ranks,
        speedup=speedup,
        efficiency=None if speedup is None else speedup / (point.ranks / base_ranks),
        step_s=_value(telemetry, "step_s"),
        exposed_comm_frac=_value(telemetry, "exposed_comm_frac") if _comm_measured(telemetry) else None,
        data_wait_frac=_value(telemetry, "data_wait_frac"),
        barrier_s=_value(telemetry, "barrier_s"),
    )


def compute_s(telemetry: Mapping[str, Any] | None) -> float | None:
    """Seconds a step computes: the step less its wait for data and its exposed communication."""
    step_s = _value(telemetry, "step_s")
    if telemetry is None or step_s is None:
        return None
    waited = (_value(telemetry, "data_wait_frac") or 0.0) * step_s
    return (
        step_s - waited - ((_value(telemetry, "exposed_comm_s") or 0.0) if _comm_measured(telemetry) else 0.0)
    )


def _slower_compute(point: Point, base_ranks: int, mode: str, alone: float | None) -> str | None:
    """Weak scaling should compute as long a step as the baseline, strong scaling 1/N of it."""
    measured = compute_s(point.telemetry)
    if measured is None or not alone:
        return None
    expected = alone if mode == "weak" else alone * base_ranks / point.ranks
    if measured <= COMPUTE_SLACK * expected:
        return None
    return (
        f"each rank computes {ms(measured)} ms a step where the baseline predicts {ms(expected)} ms: the "
        "ranks compute slower together than alone (nodes shared with other ranks or jobs, CPU threads "
        "competing for cores, slower or throttled nodes); check the cores and GPUs each rank really has"
    )


def _point_verdicts(point: Point, row: Row, base_ranks: int, mode: str, alone: float | None) -> list[str]:
    name = f"{row.label} ({row.ranks} ranks)"
    if row.state != COMPLETED:
        return [f"{name}: {row.state}, not measured"]
    if point.telemetry is None:
        return [f"{name}: completed without telemetry in its result.json, not measured"]
    # Bucket elements are weighed against each other in the bucket advice; their causes would
    # repeat those of the size they share.
    if point.role != "size":
        return []
    lines = []
    if row.throughput is None:
        lines.append(f"{name}: its telemetry has no throughput (samples_per_s, steps_per_s)")
    low = row.efficiency is not None and row.efficiency < EFFICIENCY_FLOOR
    if point.ranks < 2 or not (low or _comm_flagged(row)):
        return lines
    if row.efficiency is not None and row.speedup is not None:
        below = f", below the {EFFICIENCY_FLOOR:.0%} floor" if low else ""
        lines.append(
            f"{name}: efficiency {percent(row.efficiency)} (speedup {row.speedup:.2f}, ideal "
            f"{row.ranks / base_ranks:g}){below}"
        )
    elif not lines:
        lines.append(f"{name}: efficiency not computed (the baseline measured no throughput)")
    causes = _causes(point, row, point.telemetry)
    slower = _slower_compute(point, base_ranks, mode, alone)
    if slower:
        causes.append(slower)
    if not causes:
        causes = [_no_cause(point, row, point.telemetry, mode)]
    return lines + [f"{row.label}: {cause}" for cause in causes]


def _causes(point: Point, row: Row, telemetry: Mapping[str, Any]) -> list[str]:
    causes = []
    exposed = row.exposed_comm_frac
    if exposed is not None and exposed > COMM_CEILING:
        comm_s = _value(telemetry, "comm_s")
        of = "" if comm_s is None else f" (all-reduces take {ms(comm_s)} ms of each step in all)"
        causes.append(
            f"communication is not hidden behind compute: {percent(exposed)} of the step"
            f"{of}; more compute per step hides more of it (a larger batch per rank), a faster fabric "
            "shortens it"
        )
        # Over TCP the all-reduces are slow whatever the buckets: only worth naming when they show.
        if telemetry.get("transport") == "tcp":
            why = (
                "gloo always does: on GPU nodes, NCCL over InfiniBand/RoCE is faster"
                if telemetry.get("backend") == "gloo"
                else "NCCL without InfiniBand/RoCE: NCCL_NET=Socket, NCCL_IB_DISABLE=1, or no device found"
            )
            causes.append(
                f"gradients go over TCP sockets ({why}): check the fabric profile "
                "(`python -m slurmddp doctor --probe`, fabric.profile) and that NCCL can use the nodes' "
                "InfiniBand/RoCE devices"
            )
    buckets = _small_buckets(telemetry)
    if buckets:
        causes.append(buckets)
    if row.data_wait_frac is not None and row.data_wait_frac > DATA_CEILING:
        causes.append(
            f"ranks wait for data {percent(row.data_wait_frac)} of the step: more DataLoader workers "
            "(num_workers), faster storage"
        )
    link = _slow_link(_links(point.preflight))
    if link:
        causes.append(link)
    return causes


def _small_buckets(telemetry: Mapping[str, Any]) -> str | None:
    """Buckets so small that each all-reduce costs little more than a barrier: latency, not
    bandwidth, bounds them, and fewer larger buckets would pay it fewer times."""
    comm_s, count, barrier_s = (_value(telemetry, k) for k in ("comm_s", "buckets", "barrier_s"))
    if not _comm_measured(telemetry) or comm_s is None or count is None or barrier_s is None or count <= 1:
        return None
    each = comm_s / count
    if each >= LATENCY_BOUND * barrier_s:
        return None
    sizes = [b for b in telemetry.get("bucket_bytes") or () if isinstance(b, int | float)]
    mean = f" of {statistics.fmean(sizes) / 2**20:.2f} MB on average" if sizes else ""
    return (
        f"{count:g} gradient buckets{mean} take {ms(each)} ms each to all-reduce, under {LATENCY_BOUND} "
        f"barrier latencies ({ms(barrier_s)} ms each): latency bounds them; raise ddp.bucket_cap_mb "
        "(try `--bucket-cap-mb` in the study)"
    )


def _links(preflight: PreflightReport | None) -> list[Link]:
    found = [] if preflight is None else preflight.links
    return [
        Link(str(link["src"]), str(link["dst"]), float(link["gbps"]))
        for link in found
        if isinstance(link, Mapping) and {"src", "dst"} <= link.keys() and _value(link, "gbps") is not None
    ]


def _slow_link(links: Sequence[Link]) -> str | None:
    # Measured against the fastest link, not the median: with three nodes a slow one sits on two of
    # the three ring links, and the median is then itself slow.
    if not links:
        return None
    fastest = max(link.gbps for link in links)
    slow = [link for link in links if link.gbps < SLOW_LINK * fastest]
    if not slow:
        return None
    hosts = slow_hosts(links, SLOW_LINK * fastest)
    shown = ", ".join(f"{link.src}->{link.dst} {link.gbps:.2f} Gb/s" for link in slow)
    # slow_hosts names a host on two or more slow links, else both ends of the slowest one, which
    # one measurement cannot tell apart.
    shared = all(sum(host in (link.src, link.dst) for link in slow) >= 2 for host in hosts)
    if len(hosts) == 1:
        fix = f"exclude it (resources.exclude={hosts[0]})"
    elif shared:
        fix = f"exclude them (resources.exclude={','.join(hosts)})"
    else:
        fix = f"exclude one of them (resources.exclude={hosts[0]} or {hosts[-1]})"
    return (
        f"the preflight measured slow links on {', '.join(hosts)} ({shown}, the fastest "
        f"{fastest:.2f} Gb/s): {fix} or report it to the cluster admins"
    )


def _no_cause(point: Point, row: Row, telemetry: Mapping[str, Any], mode: str) -> str:
    if row.exposed_comm_frac is not None:
        comm = f"{percent(row.exposed_comm_frac)} exposed communication"
    elif not _comm_measured(telemetry):
        comm = "communication not measured (the model installs its own comm hook)"
    else:
        comm = "communication not measured"
    wait = (
        "data wait not measured" if row.data_wait_frac is None else f"{percent(row.data_wait_frac)} data wait"
    )
    buckets = (
        ", no latency-bound buckets"
        if _comm_measured(telemetry)
        and None not in (_value(telemetry, k) for k in ("comm_s", "buckets", "barrier_s"))
        else ""
    )
    links = "no slow preflight link" if _links(point.preflight) else "no preflight links to compare"
    where = {
        "weak": "profile one rank (torch.profiler) for work that grows with the number of ranks",
        "strong": "each rank's share of the global batch shrinks as ranks grow, so its compute runs "
        "less efficiently; a larger global batch shows whether that is it",
    }[mode]
    return f"no cause visible in the telemetry: {comm}, {wait}{buckets}, {links}; {where}"


def _overall(rows: Sequence[Row], mode: str) -> str:
    scaling = SCALING_NAMES[mode]
    sized = [r for r in rows if r.role in ("baseline", "size")]
    baseline = next((r for r in sized if r.role == "baseline"), None)
    if baseline is None or baseline.throughput is None:
        if baseline is None:
            why = "no baseline element"
        elif baseline.state != COMPLETED:
            why = f"the baseline (element {baseline.index}) ended {baseline.state}"
        else:
            why = f"the baseline (element {baseline.index}) measured no throughput"
        return f"{scaling}: {why}: speedup and efficiency cannot be computed"
    largest = max(sized, key=lambda r: r.ranks)
    where = f"{largest.ranks} ranks ({largest.label})"
    if largest.efficiency is None:
        why = largest.state if largest.state != COMPLETED else "no throughput measured"
        text = f"{scaling}: no efficiency at the largest size, {where}: {why}"
        measured = max((r for r in sized if r.efficiency is not None), key=lambda r: r.ranks)
        if measured.ranks > baseline.ranks and measured.efficiency is not None:
            text += (
                f"; the largest measured, {measured.ranks} ranks ({measured.label}): "
                f"{percent(measured.efficiency)}"
            )
        return text
    unmeasured = any(r.efficiency is None for r in sized)
    flagged = any(
        r.ranks > 1 and ((r.efficiency is not None and r.efficiency < EFFICIENCY_FLOOR) or _comm_flagged(r))
        for r in sized
    )
    efficiency = percent(largest.efficiency)
    if largest.efficiency >= EFFICIENCY_FLOOR and not (flagged or unmeasured):
        return (
            f"{scaling} is within the thresholds: efficiency {efficiency} at {where}; every size reaches "
            f"{EFFICIENCY_FLOOR:.0%} with at most {COMM_CEILING:.0%} of the step in exposed communication"
        )
    meets = "meets" if largest.efficiency >= EFFICIENCY_FLOOR else "is below"
    return f"{scaling}: efficiency {efficiency} at {where} {meets} the {EFFICIENCY_FLOOR:.0%} floor"


def _bucket_advice(rows: Sequence[Row], unit: str) -> str | None:
    tried = [r for r in rows if r.role == "bucket"]
    if not tried:
        return None
    ranks = max(r.ranks for r in tried)
    # The size element at the same ranks ran with the experiment's own bucket size: the one to beat.
    candidates = sorted(
        (r for r in rows if r.role in ("bucket", "size") and r.ranks == ranks),
        key=lambda r: (r.bucket_cap_mb is None, r.bucket_cap_mb or 0.0),
    )
    # `;` between entries: a throughput of 1,000 has a comma of its own.
    shown = "; ".join(f"{_bucket(r)}: {_measured(r)}" for r in candidates)
    measured = [r for r in candidates if r.throughput is not None]
    if not measured:
        return f"no bucket size measured a throughput at {ranks} ranks ({shown})"
    top = max(r.throughput for r in measured if r.throughput is not None)
    best = [r for r in measured if r.throughput == top]
    verb = "gives" if len(best) == 1 else "tie for"
    lead = (
        f"bucket_cap_mb: {' and '.join(_bucket(r) for r in best)} {verb} the highest throughput at "
        f"{ranks} ranks ({shown} {unit})"
    )
    # Of a tie, the smallest: its first all-reduce starts earliest in the backward pass.
    pick = best[0].bucket_cap_mb
    if pick is None:
        return f"{lead}; keep the experiment's own ddp.bucket_cap_mb"
    return f"{lead}; put `ddp: {{bucket_cap_mb: {pick:g}}}` in the experiment"


def _bucket(row: Row) -> str:
    return "own" if row.bucket_cap_mb is None else f"{row.bucket_cap_mb:g}"


def _measured(row: Row) -> str:
    if row.throughput is not None:
        return rate(row.throughput)
    return row.state if row.state != COMPLETED else "not measured"


def _comm_flagged(row: Row) -> bool:
    return row.exposed_comm_frac is not None and row.exposed_comm_frac > COMM_CEILING


def _comm_measured(telemetry: Mapping[str, Any] | None) -> bool:
    # A model with its own comm hook replaces the one that times the all-reduces.
    return telemetry is not None and telemetry.get("comm_measured") is not False


def _value(mapping: Mapping[str, Any] | None, key: str) -> float | None:
    """A finite number under `key`, else None (missing, null, NaN, or not a number)."""
    value = None if mapping is None else mapping.get(key)
    # bool is an int to Python: a stray true must not read as 1.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def percent(value: float) -> str:
    # One decimal: 89.6 % must not read as the 90 % it fails.
    return f"{value:.1%}"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"
