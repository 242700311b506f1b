"""The processes of a run's ranks on this machine (the lab's nodes are namespaces of it), found
through /proc: for the tests (through conftest) and the lab benchmarks (benchmarks/labjobs.py).
No pytest here."""

from __future__ import annotations

from pathlib import Path

from slurmddp.defaults import RESIDENT_ENV


def parent_pid(pid: int) -> int:
    """The parent of `pid`; 0 when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def rank_pids(run: Path, *, rank: int | None = None, node: int | None = None) -> list[int]:
    """PIDs of the rank processes of `run` (started by this test's submission, locally or as a
    job step's tasks), of one rank or one node index. A rank's forked loader workers share its
    command line and environment: they are among them. srun is not, though its command line
    holds the rank's and the batch script gives it SLURM_PROCID=0 and SLURM_NODEID=0."""
    logs = str(run / "logs").encode()
    wanted = []
    if rank is not None:
        wanted.append(f"SLURM_PROCID={rank}".encode())
    if node is not None:
        wanted.append(f"SLURM_NODEID={node}".encode())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0") if wanted else []
        except OSError:
            continue
        # srun itself, or (the 24.11 lab) the trixie root's ld.so running it.
        if any(arg == b"srun" or arg.endswith(b"/srun") for arg in cmdline):
            continue
        if b"submitit.core._submit" in cmdline and logs in cmdline and all(w in environ for w in wanted):
            pids.append(int(entry.name))
    return pids


def rank_mains(run: Path, *, rank: int | None = None, node: int | None = None) -> list[int]:
    """The ranks' own processes among `rank_pids`: not their loader workers (forked from them), nor
    the tasks that fork them (requeue.resident_launcher, the default), which outlive their ranks."""
    pids = set(rank_pids(run, rank=rank, node=node))
    mains = []
    for top in (pid for pid in pids if parent_pid(pid) not in pids):
        if resident_task(top):
            mains.extend(pid for pid in pids if parent_pid(pid) == top)
        else:
            mains.append(top)
    return sorted(mains)


def resident_task(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{RESIDENT_ENV}=1".encode() in environ
