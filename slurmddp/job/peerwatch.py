"""Every rank of a step learns within milliseconds that another one is gone, and ends at once.

Without it the ranks a dead one leaves behind wait: in a collective until the backend notices (gloo
as soon as the dead peer's sockets close, NCCL not before its watchdog's timeout, 10 minutes by
default), and after srun's SIGTERM (--kill-on-bad-exit) until KillWait, 30 s on most clusters: a
stop signal asks for a save at the next step boundary, which a rank blocked on a dead peer never
reaches. The restart (in the allocation or through the queue) waits for all of them.

How. Rank 0's process listens on a port it picks, published in the job's store; every other rank
holds one TCP connection to it from a daemon thread that does nothing while the step runs. However
a process ends (SIGKILL, the OOM killer, `os._exit` after its crash record), the kernel closes its
sockets, and rank 0 reads end-of-file at once; a rank that finishes in order (done, or saved for a
stop) says "bye" first, and one that raised says "crash" (its own record says why). On an end
without either, rank 0 waits GATHER_S for more (a node's ranks die together; the survivors' errors
from a dead peer's closed sockets come as crashes), records who died without a word and where,
tells every other rank, and every rank ends its process. Rank 0 gone: the others read end-of-file
from it. A node that stops answering altogether (a dead kernel sends no FIN) is found by TCP
keepalive within about 11 s. A rank is watched once rank 0 has answered it: a short script's rank 0
that finished before taking a connection in is no death.

A main thread blocked in a CUDA call or a collective does not hold the watch up: both release the
GIL while they wait (checked on an H100 for `torch.cuda.synchronize()` and `.item()`). The watch's
thread makes no torch call: one still inside torch's C++ when the process exits would abort it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slurmddp.job.distenv import DistEnv, rank_hosts
from slurmddp.job.records import AttemptId, Failure
from slurmddp.job.spec import RankSpec

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

ADDRESS_KEY = "slurmddp/peerwatch"
PEER_LOST_EXIT_STATUS = 87
GATHER_S = 0.2
"""After the first death, how long rank 0 waits for more before it tells the others: the ranks of
a node that went away die within milliseconds of each other. Rank 0's own crash waits for it too
(its error is most likely that death's), so it is added to every teardown."""
CONSEQUENCE_S = 2.0
"""A survivor's error this close before rank 0 heard of a death came from that death."""
POLL_S = 0.2
KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}
# The protocol: one word a line ("lost " is followed by the message to print).
_WELCOME = b"ok"
_BYE = b"bye"
_CRASH = b"crash"
_LOST = b"lost "


class PeerWatch:
    """One rank's side. `on_lost(message)` runs in the watch's thread once a peer is gone; it
    must end the process (end_process does)."""

    def __init__(
        self,
        store: Store,
        dist: DistEnv,
        run_dir: Path,
        hosts: Sequence[str],
        on_lost: Callable[[str], None],
    ) -> None:
        self._dist = dist
        self._run_dir = run_dir
        self._hosts = list(hosts)
        self._on_lost = on_lost
        self._left = threading.Event()
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, int | None] = {}
        self._conn: socket.socket | None = None
        self._welcomed = threading.Event()
        """A rank other than 0: rank 0 took it in, so it watches rank 0 from now on."""
        self._buffers: dict[socket.socket, bytes] = {}
        self._said_bye: set[int] = set()
        self._crashed: set[int] = set()
        """Ranks that said they crashed (their own record says why) before their end."""
        self._self_crash = threading.Event()
        self._told = threading.Event()
        self.step_of: Callable[[], int | None] = lambda: None
        """The step rank 0's training is at, for the failure record; set once the loop exists."""
        if dist.rank == 0:
            # crashed() wakes the selector through it: rank 0's own crash cannot wait for a poll.
            self._wake, self._waker = socket.socketpair()
            self._server = _listen()
            # Set here, not in the thread: the others' first read of the store waits for it.
            store.set(ADDRESS_KEY, str(self._server.getsockname()[1]))
            target: Callable[[], None] = self._serve
        else:
            # Here, not in the thread: a daemon thread still inside a torch (C++) call when the
            # process exits dies with "terminate called without an active exception". Rank 0 sets
            # it before its own process group forms, which this rank's waits for anyway.
            try:
                port = int(store.get(ADDRESS_KEY))
            except Exception:
                return  # no watch: the step's own errors and srun end it, as without one
            target = functools.partial(self._follow, port)
        threading.Thread(target=target, name="slurmddp-peerwatch", daemon=True).start()

    def leave(self) -> None:
        """This rank ends in order: its end is no death. Rank 0's end ends the watch for all."""
        with self._lock:
            self._left.set()
            targets = list(self._peers) if self._dist.rank == 0 else [self._conn]
            for conn in targets:
                _send(conn, _BYE)

    def crashed(self) -> None:
        """This rank raised, its crash recorded: the others end now, told of a crash rather than
        a silent death. Rank 0 first gathers, for GATHER_S, whoever died before it: a peer that
        died without a word is the likelier cause of its error."""
        if self._dist.rank == 0:
            self._self_crash.set()
            _send(self._waker, b"!")
            self._told.wait(GATHER_S + POLL_S)
        else:
            with self._lock:
                self._left.set()  # its own end follows: nothing more to act on
                _send(self._conn, _CRASH)

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._server, selectors.EVENT_READ)
        selector.register(self._wake, selectors.EVENT_READ)
        dead: dict[int, float] = {}
        first = 0.0
        while not self._left.is_set():
            if self._self_crash.is_set():
                first = first or time.monotonic()
            left = first + GATHER_S - time.monotonic() if first else POLL_S
            if left <= 0:
                self._tell(dead)
                return
            for key, _ in selector.select(min(left, POLL_S)):
                if key.fileobj is self._wake:
                    self._wake.recv(64)
                    continue
                if key.fileobj is self._server:
                    conn, _ = self._server.accept()
                    _keepalive(conn)
                    with self._lock:
                        self._peers[conn] = None
                    selector.register(conn, selectors.EVENT_READ)
                    continue
                assert isinstance(key.fileobj, socket.socket)
                conn = key.fileobj
                data = _recv(conn)
                if data is not None:
                    self._heard(conn, data)
                    continue
                selector.unregister(conn)
                with self._lock:
                    rank = self._peers.pop(conn, None)
                self._buffers.pop(conn, None)
                conn.close()
                if rank is not None and rank not in self._said_bye:
                    first = first or time.monotonic()
                    dead[rank] = time.time()
        self._close_all()

    def _heard(self, conn: socket.socket, data: bytes) -> None:
        """A peer's lines: its rank first, then "bye" when it ends in order."""
        buffered = self._buffers.get(conn, b"") + data
        *lines, self._buffers[conn] = buffered.split(b"\n")
        for line in lines:
            rank = self._peers.get(conn)
            if rank is None:
                with self._lock:
                    self._peers[conn] = int(line)
                    # Under the lock leave() takes: a rank taken in after rank 0 left gets its bye.
                    _send(conn, _BYE if self._left.is_set() else _WELCOME)
            elif line == _BYE:
                self._said_bye.add(rank)
            elif line == _CRASH:
                self._crashed.add(rank)

    def _tell(self, dead: dict[int, float]) -> None:
        silent = {rank: at for rank, at in dead.items() if rank not in self._crashed}
        if silent:
            message = self._record(silent)
        else:
            crashed = sorted({*dead, *([0] if self._self_crash.is_set() else [])})
            names = ", ".join(f"rank {rank} on {self._host(rank)}" for rank in crashed)
            message = f"{names} crashed (its error is in its log and failure.json), so the step cannot go on"
        with self._lock:
            for conn in list(self._peers):
                _send(conn, _LOST + message.encode())
        self._close_all()
        self._told.set()
        if not self._self_crash.is_set():
            self._on_lost(message)

    def _record(self, dead: dict[int, float]) -> str:
        """The attempt's failure, unless one that says more is there: the dead rank's own crash
        (a rank that raised writes it before it exits), or a diagnosis (a hang, a failed
        preflight, a device fault). A survivor's plain error from just before rank 0 heard of the
        death ("Connection closed by peer") is its consequence, and is replaced."""
        ranks = sorted(dead)
        names = ", ".join(f"rank {rank} on {self._host(rank)}" for rank in ranks)
        message = (
            f"{names} ended without a word (killed: SIGKILL, the out-of-memory killer, a lost node), "
            "so the step cannot go on"
        )
        attempt = AttemptId.of(self._dist)
        died_at = min(dead.values())
        earlier = Failure.read_for(self._run_dir, attempt)
        if earlier is None or _consequence(earlier, dead, died_at):
            # Ranks move in lockstep: the step a survivor's collective failed at, or rank 0's.
            step = earlier.step if earlier is not None and earlier.step is not None else self.step_of()
            Failure(
                step=step,
                rank=ranks[0],
                error=message,
                attempt=attempt,
                time=died_at,
                suspect_hosts=suspects(self._hosts, set(ranks)) or None,
            ).write(self._run_dir, replace=earlier is not None)
        return message

    def _follow(self, port: int) -> None:
        try:
            conn = socket.create_connection((self._dist.master_addr, port))
        except OSError:
            return  # rank 0 left already, or cannot be reached: as without a watch
        _keepalive(conn)
        with self._lock:
            self._conn = conn
            if self._left.is_set():
                _send(conn, _BYE)
                return
            _send(conn, str(self._dist.rank).encode())
        # Watched only once rank 0 took this rank in: a rank 0 that left in order before it did
        # (a short script) drops the connection unanswered, which is no death.
        pending = b""
        while True:
            chunk = _recv(conn)
            if self._left.is_set():
                return
            if chunk is None:
                if self._welcomed.is_set():
                    self._on_lost(
                        f"rank 0 on {self._host(0)} ended without a word (killed, or its node lost), "
                        "so the step cannot go on"
                    )
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line == _WELCOME:
                    self._welcomed.set()
                elif line == _BYE:
                    return  # rank 0 finished in order: nothing left to watch
                elif line.startswith(_LOST):
                    self._on_lost(line[len(_LOST) :].decode(errors="replace").strip())
                    return

    def _close_all(self) -> None:
        with self._lock:
            for conn in self._peers:
                conn.close()
            self._peers.clear()
        self._server.close()
        self._wake.close()
        self._waker.close()

    def _host(self, rank: int) -> str:
        return self._hosts[rank] if rank < len(self._hosts) else "?"


def start(
    store: Store, dist: DistEnv, spec: RankSpec, child: subprocess.Popen[bytes] | None = None
) -> PeerWatch | None:
    """The watch of this rank of `spec`'s step; None for a single rank. `child`: a script run as
    this rank's child, ended with it."""
    if dist.world_size == 1:
        return None
    run_dir = Path(spec.run_dir)

    def before() -> None:
        if child is not None:
            child.kill()
        if spec.executor == "local" and dist.rank == 0:
            # Slurm's batch script records a step's end after srun; a local run's rank 0 does.
            from slurmddp.job import attempts

            with contextlib.suppress(Exception):
                attempts.end_local(run_dir, AttemptId.of(dist), PEER_LOST_EXIT_STATUS, time.time())

    hosts = rank_hosts(dist, os.environ)
    return PeerWatch(store, dist, run_dir, hosts, end_process(dist.rank, before))


def _consequence(failure: Failure, dead: dict[int, float], died_at: float) -> bool:
    return (
        failure.rank not in dead
        and failure.cause is None
        and not failure.bad_hosts
        and failure.retry is not False
        and failure.time >= died_at - CONSEQUENCE_S
    )


def suspects(hosts: Sequence[str], dead: set[int]) -> dict[str, str]:
    """Hosts of two or more ranks that all died while ranks elsewhere lived on: the node is the
    likelier cause than the code (which would fail on every node). One rank per node, or every
    rank dead, tells nothing."""
    found: dict[str, str] = {}
    for host in dict.fromkeys(hosts):
        ranks = {rank for rank, where in enumerate(hosts) if where == host}
        if len(ranks) >= 2 and ranks <= dead and len(dead) < len(hosts):
            found[host] = f"its {len(ranks)} ranks died together while the other nodes' ran on"
    return found


def end_process(rank: int, before: Callable[[], None]) -> Callable[[str], None]:
    """An on_lost that says why and ends this process at once: Python's shutdown would wait for
    the training thread, blocked on the dead peer."""

    def end(message: str) -> None:
        print(f"slurmddp: rank {rank}: {message}; ending this rank", file=sys.stderr, flush=True)
        before()
        sys.stdout.flush()
        os._exit(PEER_LOST_EXIT_STATUS)

    return end


def _listen() -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def _keepalive(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):  # Linux's names; other systems keep their defaults
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _recv(conn: socket.socket) -> bytes | None:
    """What arrived; None at end-of-file or a broken connection."""
    try:
        data = conn.recv(4096)
    except OSError:
        return None
    return data or None


def _send(conn: socket.socket | None, line: bytes) -> None:
    if conn is None:
        return
    # A peer already gone: its own end is being handled.
    with contextlib.suppress(OSError):
        conn.sendall(line + b"\n")
