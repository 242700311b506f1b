"""The peer watch at scale, by simulation: rank 0's watch (job/process/peerwatch.py, as a rank runs it) with
RANKS - 1 followers spread over the lab's three nodes, each follower one connection that speaks
the watch's protocol (challenge, proof, welcome) from a light process per node (no torch). Then
one node goes silent (its link down and its processes stopped) and the watch must name that node
as lost within the bound it keeps for two ranks (job/process/liveness.py's DEAD_AFTER_S, plus the knock).

Prints, per round: how long rank 0 took to take every follower in, rank 0's process CPU time and
resident memory while watching them (idle, over WATCH_S) against the same process before any
watch, and fault -> the watch's verdict. Needs root and a running lab (SLURM_CONF and the lab's
export line in the environment: `eval "$(tests/slurm_lab/up)"`).

    python benchmarks/peerwatch_scale.py [--ranks 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from slurmddp.defaults import SLURMD_PORT_ENV
from slurmddp.job.process import liveness, peerwatch
from slurmddp.job.process.distenv import DistEnv
from slurmddp.rundir import watchkey

NODES = ("node1", "node2", "node3")
WATCH_S = 20.0
"""How long rank 0 watches its idle followers for the CPU figure."""

FOLLOWERS = textwrap.dedent(
    """
    import socket, sys, time
    from slurmddp.job.process import liveness
    from slurmddp.rundir import watchkey

    address, port, key_path, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    key = bytes.fromhex(open(key_path).read().strip())
    conns = []
    for rank in ranks:
        conn = socket.create_connection((address, port))
        liveness.keepalive(conn)
        hello = conn.recv(200).decode().split()
        conn.sendall(f"{rank} {watchkey.sign(key, hello[1], rank)}\\n".encode())
        assert conn.recv(200).startswith(b"ok "), "not taken in"
        conns.append(conn)
    print("READY", flush=True)
    time.sleep(3600)
    """
)


class Store:
    """What the watch asks of the job's store: its port, set by rank 0."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


def lab() -> dict[str, str]:
    names = ("SLURM_CONF", "SLURMDDP_LAB_NETNS_PREFIX", "SLURMDDP_LAB_VETH_PREFIX")
    if not all(name in os.environ for name in names):
        raise SystemExit('run the lab first: eval "$(tests/slurm_lab/up)"')
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    port = next(line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("SlurmdPort="))
    return {
        "netns": os.environ["SLURMDDP_LAB_NETNS_PREFIX"],
        "veth": os.environ["SLURMDDP_LAB_VETH_PREFIX"],
        "slurmd": port,
    }


def bridge_address(netns: str) -> str:
    """The controller's address on the lab's bridge (the subnet's first), as the nodes reach it."""
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "ip", "-4", "route"], capture_output=True, text=True, check=True
    )
    subnet = next(line.split()[0] for line in out.stdout.splitlines() if "scope link" in line)
    return str(ipaddress.ip_network(subnet).network_address + 1)


def one(ranks: int, where: dict[str, str]) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="peerwatch-scale-"))
    key = watchkey.run_key(run_dir)
    hosts = ["controller"] + [NODES[(rank - 1) * len(NODES) // (ranks - 1)] for rank in range(1, ranks)]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before, rss_before = usage.ru_utime + usage.ru_stime, _rss_kib()
    lost: list[tuple[float, str]] = []
    told = threading.Event()

    def on_lost(message: str) -> None:
        lost.append((time.time(), message))
        told.set()

    os.environ[SLURMD_PORT_ENV] = where["slurmd"]  # where the watch knocks to confirm a silence
    dist = DistEnv(0, 0, ranks, 1, 0, len(NODES) + 1, "controller", 0, "1", 0, None)
    store = Store()
    started = time.monotonic()
    watch = peerwatch.PeerWatch(store, dist, run_dir, hosts, on_lost, key)  # type: ignore[arg-type]
    port = store.values[peerwatch.ADDRESS_KEY]
    address = bridge_address(where["netns"] + NODES[0])
    children = []
    for node in NODES:
        mine = [str(rank) for rank in range(1, ranks) if hosts[rank] == node]
        children.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    where["netns"] + node,
                    sys.executable,
                    "-c",
                    FOLLOWERS,
                    address,
                    port,
                    str(run_dir / ".watch-key"),
                    *mine,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "READY"
    taken_in = time.monotonic() - started
    assert len([p for p in watch._peers.values() if p.rank is not None]) == ranks - 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_start = usage.ru_utime + usage.ru_stime
    time.sleep(WATCH_S)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    watching_cpu = usage.ru_utime + usage.ru_stime - cpu_start
    rss = _rss_kib() - rss_before
    victim = NODES[-1]
    veth = where["veth"] + victim.removeprefix("node")
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    os.kill(children[-1].pid, signal.SIGSTOP)
    fault = time.time()
    try:
        told.wait(60)
    finally:
        os.kill(children[-1].pid, signal.SIGCONT)
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        for child in children:
            child.kill()
            child.wait()
    if not lost:
        raise SystemExit("the silent node was never found")
    at, message = lost[0]
    if not message.startswith(f"{victim} stopped answering"):
        raise SystemExit(f"the watch said: {message}")
    return {
        "taken_in_s": taken_in,
        "cpu_per_s": watching_cpu / WATCH_S,
        "rss_mib": rss / 1024,
        "setup_cpu_s": cpu_start - cpu_before,
        "verdict_s": at - fault,
    }


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    where = lab()
    rows = []
    for round_ in range(args.rounds):
        row = one(args.ranks, where)
        rows.append(row)
        print(
            f"round {round_ + 1}, {args.ranks} ranks: taken in {row['taken_in_s']:.2f} s "
            f"(rank 0's CPU {row['setup_cpu_s']:.2f} s), watching: {row['cpu_per_s'] * 1000:.1f} ms CPU "
            f"a second, +{row['rss_mib']:.1f} MiB resident; "
            f"fault -> node named lost {row['verdict_s']:.1f} s",
            flush=True,
        )
    medians: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"median of {len(rows)}: taken in {medians['taken_in_s']:.2f} s, watching "
        f"{medians['cpu_per_s'] * 1000:.1f} ms CPU a second, +{medians['rss_mib']:.1f} MiB, fault -> "
        f"verdict {medians['verdict_s']:.1f} s "
        f"(bound: {liveness.DEAD_AFTER_S} s + a {liveness.KNOCK_S} s knock)"
    )


if __name__ == "__main__":
    main()
