"""Whether a host still answers: what tells a node that went silent (a dead kernel, a link down, a
power cut: nothing sends a FIN or a reset) from a rank that died on a live node.

Every connection of the peer watch carries TCP keepalives: while it is idle the kernel probes the
other end each second and aborts the connection (ETIMEDOUT) after DEAD_AFTER_S without an answer;
TCP_USER_TIMEOUT bounds it the same way while a line is unacknowledged. A kernel answers these
probes whatever its processes do, so an abort says the host, not a rank, went quiet. Before a
host is named lost, a fresh connection to its slurmd port confirms it: a live kernel accepts or
refuses at once (either is an answer), a silent host lets the attempt time out.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Mapping

from slurmddp.defaults import SLURMD_PORT_ENV

IDLE_S = 2
INTERVAL_S = 1
PROBES = 3
DEAD_AFTER_S = IDLE_S + INTERVAL_S * PROBES
"""A silent host is found this long after its last answer at the latest, where Slurm itself waits
SlurmdTimeout (300 s by default). Three probes a second apart: one lost packet is no death."""
KNOCK_S = 1.5
"""How long a knock at a host waits for any answer."""
SLURMD_PORT = 6818
"""Slurm's default SlurmdPort, where the batch script did not say which (SLURMD_PORT_ENV)."""


def keepalive(conn: socket.socket) -> None:
    """Make `conn` fail with ETIMEDOUT once its peer's host stops answering for DEAD_AFTER_S."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = {
        "TCP_KEEPIDLE": IDLE_S,
        "TCP_KEEPINTVL": INTERVAL_S,
        "TCP_KEEPCNT": PROBES,
        "TCP_USER_TIMEOUT": DEAD_AFTER_S * 1000,
    }
    for name, value in options.items():
        if hasattr(socket, name):  # Linux's names; other systems keep their defaults
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def went_silent(error: OSError) -> bool:
    """Whether a connection's error is its peer's host going quiet, not the peer ending."""
    return isinstance(error, TimeoutError) or error.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH)


def answers(address: str, port: int, timeout: float = KNOCK_S) -> bool:
    """Whether the host at `address` answers a connection to `port`: accepted or refused, a kernel
    is there. A timeout, or no route to it, is silence."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def slurmd_port(env: Mapping[str, str] = os.environ) -> int:
    text = env.get(SLURMD_PORT_ENV, "")
    return int(text) if text.isdigit() else SLURMD_PORT
