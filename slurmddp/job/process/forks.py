"""What a rank's forked children (DataLoader workers, a user's `os.fork`, a framework's workers)
must not keep of it: its peer-watch connections and every socket it listens on.

A fork copies every descriptor, close-on-exec or not, and a loader worker never execs. A worker of
a SIGKILLed rank kept the rank's watch connection open, so rank 0 read no end-of-file until the
orphaned worker noticed its parent was gone (torch checks every 5 s); the workers of a killed rank 0
kept its store's, gloo's and the watch's listening sockets, and with them the ports a restart binds.

In the child, each such descriptor is pointed at /dev/null rather than closed: its number stays
taken, so a copy of the parent's object that closes it later (a socket's finaliser in a child
that lives on) closes /dev/null, never a file the child opened since under the same number.
"""

from __future__ import annotations

import contextlib
import os
import socket
import weakref

_held: weakref.WeakSet[socket.socket] = weakref.WeakSet()
_installed = False


def keep_from_children(sock: socket.socket) -> None:
    """`sock` (not only listening ones) is not to be held by any child this process forks."""
    install()
    _held.add(sock)


def install() -> None:
    """From now on, a child forked by this process lets go of the sockets above (idempotent)."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=_let_go)
        _installed = True


def _let_go() -> None:
    fds = {sock.fileno() for sock in list(_held)} | set(listening_fds())
    fds.discard(-1)
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    # The child's copies of the parent's watch sockets now stand for /dev/null: forget them.
    _held.clear()


def listening_fds() -> list[int]:
    """This process's descriptors that are sockets listening for connections."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []  # not Linux: nothing known to let go of
    found = []
    for name in names:
        fd = int(name)
        try:
            probe = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or closed since the listing)
        try:
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.append(fd)
        except OSError:
            pass
        finally:
            probe.detach()  # the descriptor stays open: the probe only borrowed it
    return found
