"""job/process/forks.py: a rank's forked children (loader workers) hold none of its listening sockets and
none of its peer-watch connections, so a rank's death is seen when the rank dies, not when its
orphaned workers notice. Real forks, real sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurmddp.job.process import forks

LISTEN_THEN_FORK = textwrap.dedent(
    """
    import os, socket, sys, time
    import torch
    from torch.utils.data import DataLoader
    from slurmddp.job.process import forks

    forks.install()
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    # Two loader workers forked from this process, as ctx.loader's are; they outlive it below.
    loader = iter(DataLoader(range(10**6), num_workers=2, batch_size=1, prefetch_factor=1))
    next(loader)
    print("READY", flush=True)
    time.sleep(600)
    """
)


def test_a_loader_worker_does_not_hold_its_ranks_listening_socket() -> None:
    """The rank is SIGKILLed and its workers live on a moment (torch checks its parent every 5 s):
    its port is free at once, as a restart that binds it again needs."""
    rank = subprocess.Popen([sys.executable, "-c", LISTEN_THEN_FORK], stdout=subprocess.PIPE, text=True)
    assert rank.stdout is not None
    port = int(rank.stdout.readline())
    assert rank.stdout.readline().strip() == "READY"
    workers = _children(rank.pid)
    assert len(workers) == 2, workers
    os.kill(rank.pid, signal.SIGKILL)
    rank.wait()
    try:
        assert all(_alive(pid) for pid in workers), "the workers ended with their rank: nothing was tested"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_forked_child_lets_go_of_the_sockets_it_was_told_of_and_of_listening_ones() -> None:
    held = socket.socket()
    server = socket.create_server(("127.0.0.1", 0))
    forks.keep_from_children(held)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what does it hold under the parent's numbers?
        kinds = []
        for fd in (held.fileno(), server.fileno()):
            try:
                socket.socket(fileno=fd).detach()
                kinds.append("socket")
            except OSError:
                kinds.append("not a socket")
        os.write(writer, ",".join(kinds).encode())
        os._exit(0)
    os.close(writer)
    said = os.read(reader, 100).decode()
    os.waitpid(pid, 0)
    os.close(reader)
    assert said == "not a socket,not a socket"
    # The parent keeps its own.
    assert held.fileno() != -1 and server.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    assert server.fileno() in forks.listening_fds() and held.fileno() not in forks.listening_fds()
    held.close()
    server.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
