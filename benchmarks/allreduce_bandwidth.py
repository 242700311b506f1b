"""gloo all-reduce bus bandwidth between two lab nodes vs raw TCP throughput between the same two
network namespaces (the link's limit), and the preflight's own measurement vs a plain
torch.distributed all-reduce loop of the same size (target: preflight / plain >= 0.95).

Needs a running Slurm (SLURM_CONF set, e.g. from tests/slurm_lab/up). Runs one 2-node step,
one task per node, that alternates the three measurements for a number of rounds and prints each
round and the ratios of medians.
Usage: python benchmarks/allreduce_bandwidth.py [--rounds 5] [--size-mb 4] [--tcp-mb 256]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 20
PLAIN_REPEATS = 20


def tcp_gbps(rank: int, peer: str, port: int, megabytes: int) -> float:
    """Rank 1 streams `megabytes` to rank 0 over one TCP connection; Gb/s as rank 0 receives it."""
    total = megabytes * CHUNK
    if rank == 0:
        with socket.create_server(("", port), reuse_port=False) as server:
            conn, _ = server.accept()
            with conn:
                got = conn.recv(CHUNK)
                started = time.perf_counter()
                received = len(got)
                while received < total:
                    got = conn.recv(CHUNK)
                    if not got:
                        break
                    received += len(got)
                seconds = time.perf_counter() - started
                conn.sendall(b"k")
        return (received - CHUNK) * 8 / seconds / 1e9 if received > CHUNK else 0.0
    payload = b"\0" * CHUNK
    for _ in range(100):
        try:
            conn = socket.create_connection((peer, port))
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"cannot reach {peer}:{port}")
    with conn:
        for _ in range(megabytes):
            conn.sendall(payload)
        conn.recv(1)
    return 0.0


def plain_bus_gbps(data: object, world: int) -> float:
    """What a user would measure: warm up once, then time a loop of all-reduces."""
    import torch.distributed as tdist

    from slurmddp.job.process.preflight import bus_gbps

    tdist.all_reduce(data)  # type: ignore[arg-type]
    tdist.barrier()
    started = time.perf_counter()
    for _ in range(PLAIN_REPEATS):
        tdist.all_reduce(data)  # type: ignore[arg-type]
    seconds = (time.perf_counter() - started) / PLAIN_REPEATS
    # The slowest rank's time, as the preflight takes it.
    slowest = [0.0] * world
    tdist.all_gather_object(slowest, seconds)
    return bus_gbps(data.numel() * 4, max(slowest), world)  # type: ignore[attr-defined]


def rank_side(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as tdist

    from slurmddp.experiment.schema import Preflight
    from slurmddp.job.process import distenv, preflight
    from slurmddp.rundir.layout import PREFLIGHT

    dist = distenv.from_environment(os.environ)
    os.environ.update(distenv.rank_env(dist))
    tdist.init_process_group("gloo")
    host = socket.gethostname()
    settings = Preflight(size_mb=args.size_mb)
    data = torch.ones(int(args.size_mb * 2**20) // 4)
    run_dir = Path(args.out)
    rounds = []
    for round_ in range(args.rounds):
        tdist.barrier()
        tcp = tcp_gbps(dist.rank, dist.master_addr, dist.master_port + 1 + round_, args.tcp_mb)
        plain = plain_bus_gbps(data, dist.world_size)
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                verdict = preflight.run(settings, dist, torch.device("cpu"), host, run_dir)
            finally:
                sys.stdout = stdout
        record = json.loads((run_dir / PREFLIGHT).read_text()) if dist.rank == 0 else {}
        rounds.append(
            {
                "tcp_gbps": tcp,
                "plain_bus_gbps": plain,
                "preflight_bus_gbps": verdict.bus_gbps,
                "preflight_link_gbps": [link.gbps for link in verdict.links],
                "preflight_seconds": record.get("seconds"),
            }
        )
    if dist.rank == 0:
        print("RESULT " + json.dumps({"hosts": [host], "rounds": rounds}), flush=True)
    tdist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size-mb", type=float, default=4)
    parser.add_argument("--tcp-mb", type=int, default=256)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        rank_side(args)
        return
    out = Path.cwd() / f".allreduce-bandwidth-{os.getpid()}"
    out.mkdir()
    command = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=10",
        f"--export=ALL,OMP_NUM_THREADS=1,PYTHONPATH={ROOT}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--rank-side",
        f"--rounds={args.rounds}",
        f"--size-mb={args.size_mb}",
        f"--tcp-mb={args.tcp_mb}",
        f"--out={out}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    for leftover in out.iterdir():
        leftover.unlink()
    out.rmdir()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"srun failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    rounds = json.loads(lines[0][len("RESULT ") :])["rounds"]
    for index, r in enumerate(rounds, 1):
        links = ", ".join(f"{g:.2f}" for g in r["preflight_link_gbps"])
        print(
            f"round {index}: raw TCP {r['tcp_gbps']:.2f} Gb/s; gloo all-reduce bus: plain loop "
            f"{r['plain_bus_gbps']:.2f} Gb/s, preflight {r['preflight_bus_gbps']:.2f} Gb/s "
            f"(ring links {links} Gb/s; whole check {r['preflight_seconds']:.3f} s)"
        )

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    tcp, plain, pre = median("tcp_gbps"), median("plain_bus_gbps"), median("preflight_bus_gbps")
    print(
        f"median: raw TCP {tcp:.2f} Gb/s; plain all-reduce bus {plain:.2f} Gb/s; preflight bus {pre:.2f} Gb/s"
    )
    print(f"ratio gloo all-reduce bus / raw TCP (share of the link's limit): {plain / tcp:.3f}")
    print(f"ratio preflight / plain all-reduce (target >= 0.95): {pre / plain:.3f}")


if __name__ == "__main__":
    main()
