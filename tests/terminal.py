"""A command run in a real pseudo-terminal, as a user at a terminal of a given size runs it: the
process is a session leader with the pty as its controlling terminal (so a Ctrl-C typed into it
is the line discipline's SIGINT to the foreground process group, not a signal a test picks), its
stdin, stdout and stderr are the pty, and what it draws comes back as the bytes a terminal got."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CTRL_C = b"\x03"
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


@dataclass
class Terminal:
    """One command in a pty; `screen_lines` is what it wrote, escapes and carriage returns
    removed, one entry per line."""

    pid: int
    master: int
    columns: int
    raw: bytearray = field(default_factory=bytearray)
    returncode: int | None = None

    @classmethod
    def start(
        cls, argv: Sequence[str], cwd: str, env: Mapping[str, str], columns: int, rows: int = 40
    ) -> Terminal:
        pid, master = pty.fork()
        if pid == 0:  # the child: the pty's slave is its stdin, stdout, stderr and terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
                # As an interactive shell starts a foreground program: a suite started in the
                # background of a script (`cmd &`) has SIGINT and SIGQUIT ignored, which exec keeps
                # and Python then honours, so a typed Ctrl-C would do nothing.
                for signum in (signal.SIGINT, signal.SIGQUIT):
                    signal.signal(signum, signal.SIG_DFL)
                os.chdir(cwd)
                os.execvpe(argv[0], list(argv), {**env, "COLUMNS": str(columns), "TERM": "xterm"})
            finally:
                os._exit(127)
        return cls(pid, master, columns)

    def text(self) -> str:
        return self.raw.decode(errors="replace")

    def screen_lines(self) -> list[str]:
        return _ESCAPES.sub("", self.text()).split("\n")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def read_until(self, done: Callable[[Terminal], bool], timeout: float) -> bool:
        """Read what it draws until `done` holds (True) or it exits or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while not done(self):
            if self.returncode is not None or time.monotonic() > deadline:
                return done(self)
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready and not self._read():
                self._reap()
        return True

    def wait(self, timeout: float) -> int:
        """Read everything until it exits; its exit status (a signal's death as 128 + N)."""
        self.read_until(lambda _: False, timeout)
        if self.returncode is None:
            raise TimeoutError(f"still running after {timeout} s:\n{self.text()[-3000:]}")
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)
        self._reap()

    def _read(self) -> bool:
        try:
            chunk = os.read(self.master, 65536)
        except OSError as exc:  # EIO: every process holding the slave has closed it
            if exc.errno != errno.EIO:
                raise
            return False
        self.raw += chunk
        return bool(chunk)

    def _reap(self) -> None:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            if self.returncode < 0:
                self.returncode = 128 - self.returncode
            os.close(self.master)
