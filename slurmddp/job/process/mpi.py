"""The in-job MPI handshake, for ranks started by an MPI launcher: mpiexec/mpirun, or srun with
an MPI plugin (`srun --mpi=pmi2`).

MPI (mpi4py) says where each rank stands: rank and size from COMM_WORLD, local rank from the
ranks sharing its node (Split_type COMM_TYPE_SHARED). Rank 0 picks the address its peers reach it
on and a free port and broadcasts both over MPI; torch.distributed then starts as usual from the
env:// variables. MPI carries only this handshake: the training collectives stay on gloo/NCCL.
(`python -m slurmddp mpilaunch`, in the CLI, is what mpiexec starts outside Slurm.)
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from slurmddp.errors import DistEnvError
from slurmddp.job.process.distenv import DistEnv, select_device
from slurmddp.rundir.records import in_job_restart

# What each launcher exports to its ranks: Open MPI; MPICH's hydra, Intel MPI and Slurm's pmi2
# plugin (PMI-1/2); PMIx launchers (srun --mpi=pmix, prrte).
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_SIOCGIFADDR = 0x8915


def under_mpi(env: Mapping[str, str]) -> bool:
    return any(name in env for name in RANK_VARS)


def choose(launcher: str, env: Mapping[str, str]) -> str:
    """`mpi` when the rank should take its place from MPI, else `env` (Slurm's or submitit's variables).

    `auto` trusts Slurm where Slurm describes the same world as MPI (srun --mpi=pmi2 sets both):
    asking MPI would only add MPI_Init to every start. It takes MPI when the rank runs under an MPI
    launcher that Slurm does not describe: mpiexec outside Slurm, or mpiexec inside an allocation,
    whose ranks inherit the variables of the single srun task that started MPI's daemons.
    """
    if launcher == "mpi":
        return "mpi"
    if launcher == "slurm" or env.get("SUBMITIT_EXECUTOR") == "local" or not under_mpi(env):
        return "env"
    mpi_size = next((env[name] for name in SIZE_VARS if name in env), None)
    slurm_size = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if "SLURM_PROCID" in env and (mpi_size is None or mpi_size == slurm_size):
        return "env"
    return "mpi"


def check_available() -> None:
    """Refuse `launcher: mpi` where mpi4py is missing, before anything is submitted or started."""
    if importlib.util.find_spec("mpi4py") is None:
        raise DistEnvError(
            "dist.launcher is mpi but this Python cannot import mpi4py; install it "
            "(pip install 'slurmddp[mpi]') or use dist.launcher=slurm"
        )


def mpi() -> Any:
    """mpi4py's MPI module, initialised; a clear error where mpi4py or its MPI library is missing."""
    check_available()
    import mpi4py

    # Initialised below, once the library is known (MPI_Get_library_version needs no MPI_Init).
    mpi4py.rc.initialize = False
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        # mpi4py 4's wheels load the MPI library at import and raise RuntimeError("cannot load MPI
        # library") when there is none.
        raise DistEnvError(
            f"mpi4py is installed but cannot load an MPI library: {str(exc).splitlines()[0]}; install "
            "one (the `mpich` or `openmpi` Python package, or the system's MPI) on every node"
        ) from None
    if not MPI.Is_initialized():
        os.environ.update(library_env(MPI.Get_library_version(), os.environ))
        MPI.Init_thread()
    return MPI


def library_env(version: str, env: Mapping[str, str]) -> dict[str, str]:
    """What an MPI library needs set before MPI_Init. MPICH's UCX netmod sends 4096 bytes of its
    address buffer, most of it leftover memory, and a PMI-1 `put` line of it can exceed the 1024
    bytes Slurm's pmi2 plugin reads at once (src/plugins/mpi/pmi2/pmi1.c: one read, "TODO: read
    until newline"); the cut line fails MPI_Init on some runs (2 of 19 on Slurm 24.11, 0 of 18
    with the OFI netmod). MPI here only carries the handshake, so its transport's speed does not
    matter. The user's own MPIR_CVAR_CH4_NETMOD stands."""
    device = next((line for line in version.splitlines() if line.startswith("MPICH Device:")), "")
    if "ofi" in device and "MPIR_CVAR_CH4_NETMOD" not in env:
        return {"MPIR_CVAR_CH4_NETMOD": "ofi"}
    return {}


def from_mpi(env: Mapping[str, str], port: int | None = None) -> DistEnv:
    """This rank's DistEnv from MPI. Collective: every rank of COMM_WORLD must call it."""
    MPI = mpi()
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    host = socket.gethostname()
    hosts: list[str] = world.allgather(host)
    nodes = list(dict.fromkeys(hosts))
    picked = (rendezvous_address(env), port or free_port()) if world.Get_rank() == 0 else None
    addr, chosen_port = world.bcast(picked, root=0)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    rank, size = world.Get_rank(), world.Get_size()
    library = MPI.Get_library_version().splitlines()[0].strip()
    # MPI's part ends here. Left initialised, MPICH 5.0 finalised at exit alongside torch's threads
    # and a rank sometimes died in std::terminate there (seen on the lab under srun --mpi=pmi2).
    node.Free()
    MPI.Finalize()
    if rank == 0:
        print(
            f"slurmddp: ranks from MPI ({library}): {size} on {len(nodes)} node(s); "
            f"rank 0 listens on {addr}:{chosen_port}",
            flush=True,
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=size,
        local_world_size=local_size,
        node_rank=nodes.index(host),
        num_nodes=len(nodes),
        master_addr=addr,
        master_port=chosen_port,
        job_id=env.get("SLURM_JOB_ID", ""),
        restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
        device_index=select_device(env, local_rank),
        in_job_restart=in_job_restart(env),
    )


def rendezvous_address(env: Mapping[str, str]) -> str:
    """The address rank 0's peers reach it on: that of the interface gloo/NCCL are told to use,
    else what this host's name resolves to."""
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        ifname = env.get(name, "").split(",")[0].strip()
        # A `^eth0` exclusion or an `=ib0`/`ib` prefix (NCCL's syntax) names no single interface.
        if ifname and not ifname.startswith(("^", "=")):
            try:
                return interface_address(ifname)
            except OSError:
                continue
    return socket.gethostbyname(socket.gethostname())


def interface_address(ifname: str) -> str:
    """The IPv4 address of a network interface of this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", ifname.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24])


def free_port() -> int:
    """A port nothing listens on now; rank 0's TCPStore binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])
