"""Every rank of a step learns within a second that another one is gone, and ends at once.

Without it the ranks a dead one leaves behind wait: in a collective until the backend notices (gloo
as soon as the dead peer's sockets close, NCCL not before its watchdog's timeout, 10 minutes by
default), and after srun's SIGTERM (--kill-on-bad-exit) until KillWait, 30 s on most clusters: a
stop signal asks for a save at the next step boundary, which a rank blocked on a dead peer never
reaches. The restart (in the allocation or through the queue) waits for all of them.

How. Rank 0's process listens on a port it picks, published in the job's store; every other rank
holds one TCP connection to it from a daemon thread that does nothing while the step runs. However
a process ends (SIGKILL, the OOM killer, `os._exit` after its crash record), the kernel closes its
sockets, and rank 0 reads end-of-file at once (no forked child keeps them: job/process/forks.py); a rank
that finishes in order (done, or saved for a stop) says "bye" first, and one that raised says
"crash" (its own record says why). On an end without either, rank 0 waits GATHER_S for more (a
node's ranks die together; the survivors' errors from a dead peer's closed sockets come as
crashes), records who died without a word and where, tells every other rank, and every rank ends
its process. Rank 0 gone: the others read end-of-file from it. A rank is watched once rank 0 has
answered it: a short script's rank 0 that finished before taking a connection in is no death.

A node that stops answering altogether (a dead kernel, a link down: nothing sends a FIN) is found
by TCP keepalive within job/process/liveness.py's DEAD_AFTER_S; once a knock at its slurmd port confirms
the silence, the node is lost as a whole, every rank on it at once, and named in the attempt's
failure record as a bad host: the batch script's step watch (job/allocation/stepwatch.py) ends srun, which
would wait for that node until Slurm calls it down, and the next step runs without it.

Anyone on the cluster can reach the port: a connection counts only once it answered a challenge
under the run's key (rundir/watchkey.py), each side proves itself to the other, and a line that is
not the protocol's is dropped, never fatal.

A main thread blocked in a CUDA call or a collective does not hold the watch up: both release the
GIL while they wait (checked on an H100 for `torch.cuda.synchronize()` and `.item()`). The watch's
thread makes no torch call: one still inside torch's C++ when the process exits would abort it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slurmddp.job.process import forks, liveness
from slurmddp.job.process.distenv import DistEnv, rank_hosts
from slurmddp.job.spec import RankSpec
from slurmddp.rundir import watchkey
from slurmddp.rundir.records import AttemptId, Failure, Unwatched

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
PROVE_S = 10.0
"""A connection that has not proven itself a rank of the run this long after it came is dropped."""
MAX_UNPROVEN = 64
"""Connections waiting to prove themselves at once; beyond it the oldest is dropped, so a flood
of strangers cannot take every descriptor of rank 0's process."""
MAX_LINE = 512
"""The longest line a rank sends rank 0; a longer one is nobody's, and its connection is dropped."""
REFUSALS_SHOWN = 5
# The protocol, one line each way at a time: rank 0 "hello NONCE"; the rank "RANK MAC"; rank 0
# "ok MAC" (or "bye" when it left already); then the rank's "bye" or "crash", rank 0's "bye" or
# "lost MESSAGE".
_HELLO = b"hello "
_WELCOME = b"ok "
_BYE = b"bye"
_CRASH = b"crash"
_LOST = b"lost "


@dataclass
class _Peer:
    """A connection rank 0 took: a stranger until it proves it is a rank of the run."""

    conn: socket.socket
    address: str
    nonce: str
    since: float
    rank: int | None = None
    pending: bytes = field(default=b"")


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
        key: bytes,
    ) -> None:
        self._dist = dist
        self._run_dir = run_dir
        self._hosts = list(hosts)
        self._on_lost = on_lost
        self._key = key
        self._slurmd_port = liveness.slurmd_port()
        self._left = threading.Event()
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, _Peer] = {}
        self._unproven: dict[socket.socket, _Peer] = {}
        """Rank 0: the connections still to prove themselves, oldest first (a subset of _peers)."""
        self._conn: socket.socket | None = None
        self._welcomed = threading.Event()
        """A rank other than 0: rank 0 took it in, so it watches rank 0 from now on."""
        self._said_bye: set[int] = set()
        self._crashed: set[int] = set()
        """Ranks that said they crashed (their own record says why) before their end."""
        self._refused = 0
        self._self_crash = threading.Event()
        self._told = threading.Event()
        self.step_of: Callable[[], int | None] = lambda: None
        """The step rank 0's training is at, for the failure record; set once the loop exists."""
        if dist.rank == 0:
            self._open_port(store)
            target: Callable[[], None] = self._serve
        else:
            port = self._rank0_port(store)
            if port is None:
                return
            target = functools.partial(self._follow, port)
        threading.Thread(target=self._running(target), name="slurmddp-peerwatch", daemon=True).start()

    def _open_port(self, store: Store) -> None:
        """Rank 0, before the watch's thread starts: open the port the other ranks connect to, and
        publish it in the store."""
        # crashed() wakes the selector through it: rank 0's own crash cannot wait for a poll.
        self._wake, self._waker = socket.socketpair()
        self._server = _listen()
        for sock in (self._server, self._wake, self._waker):
            forks.keep_from_children(sock)
        # Set here, not in the thread: the others' first read of the store waits for it.
        store.set(ADDRESS_KEY, str(self._server.getsockname()[1]))

    def _rank0_port(self, store: Store) -> int | None:
        """A rank other than 0, before the watch's thread starts: the port rank 0 published; None,
        said and recorded, where the store has none."""
        # Here, not in the thread: a daemon thread still inside a torch (C++) call when the
        # process exits dies with "terminate called without an active exception". Rank 0 sets
        # it before its own process group forms, which this rank's waits for anyway.
        try:
            return int(store.get(ADDRESS_KEY))
        except Exception as exc:
            self._say(f"warning: no peer watch ({exc!r}): a peer that dies without a word is found late")
            self._unwatched(f"could not start: the store has no watch address ({exc!r})")
            return None

    def leave(self) -> None:
        """This rank ends in order: its end is no death. Rank 0's end ends the watch for all."""
        with self._lock:
            self._left.set()
            targets = (
                [p.conn for p in self._peers.values() if p.rank is not None]
                if self._dist.rank == 0
                else [self._conn]
            )
            for conn in targets:
                _send(conn, _BYE)

    def crashed(self) -> None:
        """This rank raised, its crash recorded: the others end now, told of a crash rather than
        a silent death. Rank 0 first gathers, for GATHER_S, whoever died before it: a peer that
        died without a word is the likelier cause of its error."""
        if self._dist.rank == 0:
            self._self_crash.set()
            _send(self._waker, b"!")
            self._told.wait(GATHER_S + POLL_S + liveness.KNOCK_S)
        else:
            with self._lock:
                self._left.set()  # its own end follows: nothing more to act on
                _send(self._conn, _CRASH)

    def _running(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:
                self._say(
                    f"warning: the peer watch stopped ({exc!r}): a peer that dies without a word is "
                    "found late from now on"
                )
                self._unwatched(f"stopped ({exc!r})")

        return run

    def _say(self, text: str) -> None:
        print(f"slurmddp: rank {self._dist.rank}: {text}", file=sys.stderr, flush=True)

    def _unwatched(self, what: str) -> None:
        """Record for `status` that this rank's watch `what` (its log says so too)."""
        # A rank trains on without its watch: a run directory it cannot write to must not end it.
        with contextlib.suppress(OSError):
            Unwatched(self._dist.rank, what, AttemptId.of(self._dist), time.time()).write(self._run_dir)

    # ---- rank 0 ----

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._server, selectors.EVENT_READ)
        selector.register(self._wake, selectors.EVENT_READ)
        dead: dict[int, float] = {}
        silent: dict[str, float] = {}
        first = 0.0
        while not self._left.is_set():
            if self._self_crash.is_set():
                first = first or time.monotonic()
            left = first + GATHER_S - time.monotonic() if first else POLL_S
            if left <= 0:
                self._tell(dead, silent)
                return
            for key, _ in selector.select(min(left, POLL_S)):
                if key.fileobj is self._wake:
                    self._wake.recv(64)
                elif key.fileobj is self._server:
                    self._take(selector)
                else:
                    assert isinstance(key.fileobj, socket.socket)
                    ended = self._read(key.fileobj, selector)
                    if ended is not None and self._died(*ended, dead, silent):
                        first = first or time.monotonic()
            self._drop_unproven(selector)
        self._close_all()

    def _died(
        self, rank: int, address: str, quiet: bool, dead: dict[int, float], silent: dict[str, float]
    ) -> bool:
        """A proven rank's connection ended: whether that is a death (`dead` and `silent` take it).
        A host that went quiet, confirmed by a knock, is lost with every rank it holds."""
        host = self._host(rank)
        at = time.time()
        if quiet and (host in silent or not liveness.answers(address, self._slurmd_port)):
            silent.setdefault(host, at)
            for other, where in enumerate(self._hosts):
                if where == host:
                    dead.setdefault(other, at)
            return True
        if rank in self._said_bye:
            return False
        dead.setdefault(rank, at)
        return True

    def _take(self, selector: selectors.BaseSelector) -> None:
        try:
            conn, address = self._server.accept()
        except OSError:
            return  # out of descriptors, or the peer gone again: nothing taken in
        forks.keep_from_children(conn)
        liveness.keepalive(conn)
        if len(self._unproven) >= MAX_UNPROVEN:
            self._drop(next(iter(self._unproven.values())), selector)
        nonce = secrets.token_hex(16)
        with self._lock:
            self._peers[conn] = self._unproven[conn] = _Peer(conn, str(address[0]), nonce, time.monotonic())
        selector.register(conn, selectors.EVENT_READ)
        _send(conn, _HELLO + nonce.encode())

    def _read(self, conn: socket.socket, selector: selectors.BaseSelector) -> tuple[int, str, bool] | None:
        """Take what a connection says; (rank, its address, whether its host went quiet) when a
        proven rank's connection ended."""
        peer = self._peers.get(conn)
        if peer is None:
            return None  # dropped earlier in the same round of events (a flood's oldest stranger)
        try:
            data = conn.recv(4096)
        except OSError as exc:
            data, quiet = b"", liveness.went_silent(exc)
        else:
            quiet = False
        if data:
            self._heard(peer, data, selector)
            return None
        self._drop(peer, selector)
        return None if peer.rank is None else (peer.rank, peer.address, quiet)

    def _heard(self, peer: _Peer, data: bytes, selector: selectors.BaseSelector) -> None:
        *lines, peer.pending = (peer.pending + data).split(b"\n")
        if len(peer.pending) > MAX_LINE:
            self._refuse(peer, "sent more than a line", selector)
            return
        for line in lines:
            if peer.rank is not None:
                if line == _BYE:
                    self._said_bye.add(peer.rank)
                elif line == _CRASH:
                    self._crashed.add(peer.rank)
                # Anything else is not the protocol's: a proven rank never sends it. Dropped.
                continue
            rank = self._proven(peer, line)
            if rank is None:
                self._refuse(peer, "did not prove it is a rank of this run", selector)
                return
            with self._lock:
                peer.rank = rank
                del self._unproven[peer.conn]
                # Under the lock leave() takes: a rank taken in after rank 0 left gets its bye.
                answer = _BYE if self._left.is_set() else _WELCOME + self._mac(peer.nonce, "ok", str(rank))
                _send(peer.conn, answer)

    def _proven(self, peer: _Peer, line: bytes) -> int | None:
        words = line.decode(errors="replace").split()
        if len(words) != 2 or not words[0].isdigit():
            return None
        rank = int(words[0])
        if not 0 < rank < self._dist.world_size:
            return None
        return rank if watchkey.signed(self._key, words[1], peer.nonce, words[0]) else None

    def _refuse(self, peer: _Peer, why: str, selector: selectors.BaseSelector) -> None:
        self._refused += 1
        if self._refused <= REFUSALS_SHOWN:
            more = "; later ones are not shown" if self._refused == REFUSALS_SHOWN else ""
            self._say(f"the peer watch dropped a connection from {peer.address} that {why}{more}")
        self._drop(peer, selector)

    def _drop_unproven(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for peer in list(self._unproven.values()):
            if now - peer.since <= PROVE_S:
                break  # oldest first: the rest are younger
            self._refuse(peer, f"did not prove it is a rank of this run within {PROVE_S:.0f} s", selector)

    def _drop(self, peer: _Peer, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(peer.conn)
        with self._lock:
            self._peers.pop(peer.conn, None)
            self._unproven.pop(peer.conn, None)
        peer.conn.close()

    def _tell(self, dead: dict[int, float], silent: dict[str, float]) -> None:
        quiet = {rank: at for rank, at in dead.items() if rank not in self._crashed}
        if quiet:
            message = self._record(quiet, silent)
        else:
            crashed = sorted({*dead, *([0] if self._self_crash.is_set() else [])})
            names = ", ".join(f"rank {rank} on {self._host(rank)}" for rank in crashed)
            message = f"{names} crashed (its error is in its log and failure.json), so the step cannot go on"
        with self._lock:
            for peer in self._peers.values():
                if peer.rank is not None and peer.rank not in dead:
                    _send(peer.conn, _LOST + message.encode())
        self._close_all()
        self._told.set()
        if not self._self_crash.is_set():
            self._on_lost(message)

    def _record(self, dead: dict[int, float], silent: dict[str, float]) -> str:
        """The attempt's failure, unless one that says more is there: the dead rank's own crash
        (a rank that raised writes it before it exits), or a diagnosis (a hang, a failed
        preflight, a device fault). A survivor's plain error from just before rank 0 heard of the
        death ("Connection closed by peer") is its consequence, and is replaced. A host that went
        silent outranks them all: whatever its ranks recorded came before they froze."""
        ranks = sorted(dead)
        killed = [rank for rank in ranks if self._host(rank) not in silent]
        parts = [_silent_words(host) for host in sorted(silent)]
        if killed:
            names = ", ".join(f"rank {rank} on {self._host(rank)}" for rank in killed)
            parts.append(
                f"{names} ended without a word (killed: SIGKILL, the out-of-memory killer, a lost node)"
            )
        message = "; ".join(parts) + ", so the step cannot go on"
        attempt = AttemptId.of(self._dist)
        died_at = min(dead.values())
        earlier = Failure.read_for(self._run_dir, attempt)
        if earlier is None or silent or _consequence(earlier, dead, died_at):
            # Ranks move in lockstep: the step a survivor's collective failed at, or rank 0's.
            step = earlier.step if earlier is not None and earlier.step is not None else self.step_of()
            Failure(
                step=step,
                rank=ranks[0],
                error=message,
                attempt=attempt,
                time=died_at,
                bad_hosts={host: _silent_words(host) for host in silent} or None,
                suspect_hosts=None if silent else suspects(self._hosts, set(ranks)) or None,
            ).write(self._run_dir, replace=earlier is not None)
        return message

    def _mac(self, *words: str) -> bytes:
        return watchkey.sign(self._key, *words).encode()

    # ---- every other rank ----

    def _follow(self, port: int) -> None:
        try:
            conn = socket.create_connection((self._dist.master_addr, port))
        except OSError:
            return  # rank 0 left already, or cannot be reached: as without a watch
        forks.keep_from_children(conn)
        liveness.keepalive(conn)
        with self._lock:
            self._conn = conn
            if self._left.is_set():
                _send(conn, _BYE)
                return
        # Watched only once rank 0 took this rank in: a rank 0 that left in order before it did
        # (a short script) drops the connection unanswered, which is no death.
        lines = _Lines(conn)
        if not self._prove(conn, lines):
            return
        self._welcomed.set()
        for line in lines:
            if self._left.is_set():
                return  # this rank's own end is under way (a crash): nothing to act on
            if line == _BYE:
                return  # rank 0 finished in order: nothing left to watch
            if line.startswith(_LOST):
                self._on_lost(line[len(_LOST) :].decode(errors="replace").strip())
                return
        if self._left.is_set():
            return
        if lines.quiet and not liveness.answers(self._dist.master_addr, self._slurmd_port):
            self._rank_0_silent()
        else:
            self._on_lost(
                f"rank 0 on {self._host(0)} ended without a word (killed, or its node lost), "
                "so the step cannot go on"
            )

    def _prove(self, conn: socket.socket, lines: _Lines) -> bool:
        """Answer rank 0's challenge and check its answer: whether this rank is watched now."""
        hello = next(lines, b"")
        if not hello.startswith(_HELLO):
            return False
        nonce = hello[len(_HELLO) :].decode(errors="replace").strip()
        rank = str(self._dist.rank)
        with self._lock:
            if self._left.is_set():
                return False
            _send(conn, f"{rank} {watchkey.sign(self._key, nonce, rank)}".encode())
        welcome = next(lines, b"")
        if not welcome.startswith(_WELCOME):
            return False  # "bye": rank 0 left before it took this rank in
        if not watchkey.signed(
            self._key, welcome[len(_WELCOME) :].decode(errors="replace"), nonce, "ok", rank
        ):
            self._say("warning: the peer watch's port did not prove it is rank 0's: not watching")
            self._unwatched(
                "did not start: the port published as rank 0's watch did not prove it is rank 0's"
            )
            return False
        return not self._left.is_set()

    def _rank_0_silent(self) -> None:
        """Rank 0's host stopped answering: no one else can record it, so each rank tries (the
        first record of the attempt stands)."""
        host = self._host(0)
        lost = [rank for rank, where in enumerate(self._hosts) if where == host]
        Failure(
            step=None,
            rank=0,
            error=f"{_silent_words(host)}, so the step cannot go on",
            attempt=AttemptId.of(self._dist),
            time=time.time(),
            bad_hosts={host: _silent_words(host)},
        ).write(self._run_dir)
        names = ", ".join(f"rank {rank}" for rank in lost)
        self._on_lost(f"{_silent_words(host)} ({names} with it), so the step cannot go on")

    def _close_all(self) -> None:
        with self._lock:
            for peer in self._peers.values():
                peer.conn.close()
            self._peers.clear()
        self._server.close()
        self._wake.close()
        self._waker.close()

    def _host(self, rank: int) -> str:
        return self._hosts[rank] if rank < len(self._hosts) else "?"


def _silent_words(host: str) -> str:
    return (
        f"{host} stopped answering (no reply for {liveness.DEAD_AFTER_S} s, not even to a new "
        "connection: its kernel, link or power is gone)"
    )


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
            from slurmddp.job.allocation import attempts

            with contextlib.suppress(Exception):
                attempts.end_local(run_dir, AttemptId.of(dist), PEER_LOST_EXIT_STATUS, time.time())

    hosts = rank_hosts(dist, os.environ)
    key = watchkey.run_key(run_dir)
    return PeerWatch(store, dist, run_dir, hosts, end_process(dist.rank, before), key)


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


class _Lines:
    """The lines a connection brings, until it ends; `quiet`: it ended as its peer's host went
    silent (job/process/liveness.py), not by the peer closing it."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._lines: list[bytes] = []
        self._pending = b""
        self.quiet = False

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> bytes:
        while not self._lines:
            try:
                chunk = self._conn.recv(4096)
            except OSError as exc:
                self.quiet, chunk = liveness.went_silent(exc), b""
            if not chunk:
                raise StopIteration
            *self._lines, self._pending = (self._pending + chunk).split(b"\n")
        return self._lines.pop(0)


def _listen() -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def _send(conn: socket.socket | None, line: bytes) -> None:
    if conn is None:
        return
    # A peer already gone: its own end is being handled.
    with contextlib.suppress(OSError):
        conn.sendall(line + b"\n")
