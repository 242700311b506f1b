"""The job's rendezvous store (TCPStore), kept alive until every rank is done with it.

When rank 0's own process hosts the store, as `init_process_group("env://")` arranges, the store
goes away the moment rank 0 exits; a rank still tearing down its process group then talks to a
closed socket, and a script rank died at its end with `terminate called without an active
exception` (4 of 7 first attempts of a public 2-rank script on the lab; 0 of 4 under torchrun).
torchrun keeps the store in its agent, which outlives every worker and leaves only after an exit
barrier. The rank's own process plays the agent here: for a script it hosts the store on rank 0
(the script connects as a client, TORCHELASTIC_USE_AGENT_STORE=True); for a function the runtime
creates the store and hands it to init_process_group. Either way rank 0 leaves only once every
rank has checked out, or the barrier's timeout has passed.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from slurmddp.errors import DistEnvError
from slurmddp.job.process.distenv import DistEnv

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

EXITED_KEY = "slurmddp/exited"
ARRIVED_KEY = "slurmddp/arrived"
"""The ranks that checked in at the start, appended as `R ` each."""
ALL_ARRIVED_KEY = "slurmddp/all-arrived"
POLL_S = 0.05


def open_store(dist: DistEnv, timeout_s: float) -> Store:
    """The job's store: hosted by rank 0's process, a client everywhere else."""
    # Where torch.distributed's TCPStore is defined; the re-export is untyped.
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(
        host_name=dist.master_addr,
        port=dist.master_port,
        world_size=dist.world_size,
        is_master=dist.rank == 0,
        timeout=timedelta(seconds=timeout_s),
        # init_process_group (or the script's own rendezvous) is the barrier at the start.
        wait_for_workers=False,
    )


def arrive(store: Store, dist: DistEnv, timeout_s: float, seen: Callable[[list[int]], None]) -> None:
    """Check this rank in and wait, at most `timeout_s`, until every rank has, before the process
    group forms (whose own wait is bounded by dist.timeout_s, and whose NCCL flavour does not wait
    at all). Rank 0 tells `seen` who has checked in as they do: the start-up watchdog names the
    ranks that never came, and its thread must not ask the store itself (job/process/watchdog.py)."""
    # One key rank 0 reads whole, however many ranks; in torch's Store since 2.1, not in its stub.
    store.append(ARRIVED_KEY, f"{dist.rank} ")  # type: ignore[attr-defined]
    if dist.rank != 0:
        store.wait([ALL_ARRIVED_KEY], timedelta(seconds=timeout_s))
        return
    deadline = time.monotonic() + timeout_s
    arrived: list[int] = []
    while len(arrived) < dist.world_size:
        # Polled: a wait that times out logs a warning each time it does.
        if time.monotonic() > deadline:
            raise DistEnvError(
                f"{dist.world_size - len(arrived)} rank(s) did not reach the rendezvous in {timeout_s:.0f} s"
            )
        now = sorted(int(rank) for rank in store.get(ARRIVED_KEY).split())
        if now != arrived:
            arrived = now
            seen(arrived)
        else:
            time.sleep(POLL_S)
    store.set(ALL_ARRIVED_KEY, "1")


def exit_barrier(store: Store, dist: DistEnv, timeout_s: float, stopping: Callable[[], bool]) -> bool:
    """Check this rank out; on rank 0, wait for every rank to have done so. False when rank 0
    gave up: on a stop signal (the step is ending: the time limit, or srun ending the ranks after
    one died, which took its check-out with it), or after `timeout_s`."""
    checked_out = store.add(EXITED_KEY, 1)
    if dist.rank != 0:
        return True
    deadline = time.monotonic() + timeout_s
    while checked_out < dist.world_size:
        if stopping():
            return False
        if time.monotonic() > deadline:
            print(
                f"slurmddp: {dist.world_size - checked_out} rank(s) had not finished {timeout_s:.0f} s "
                "after rank 0; closing the rendezvous store without them",
                file=sys.stderr,
                flush=True,
            )
            return False
        time.sleep(POLL_S)
        checked_out = store.add(EXITED_KEY, 0)
    return True


def check_port_free(port: int) -> None:
    """Fail with the reason when rank 0's rendezvous port is taken, instead of a bare EADDRINUSE."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEADDR as TCPStore sets it: a TIME_WAIT socket left by this job's previous attempt
    # does not block the port, only a live listener does.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DistEnvError(
                f"MASTER_PORT {port} is already in use on {socket.gethostname()} (another job on this "
                "node, or a job whose id differs from this one by a multiple of 10000); set dist.port"
            ) from None
        raise
    finally:
        probe.close()
