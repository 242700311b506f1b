"""The script's process, a child of its rank's (job/script/scriptrank.py), running
job/script/scriptrun.py as `python -m slurmddp.job.script.scriptrun ARGS...` would.

It is forked, not started anew: the rank's process already imported torch and torch._dynamo (the
resident launcher's task did, job/launch/resident.py), which a new interpreter would import again
for every rank of every attempt (1.2-1.5 s of CPU a rank on an idle core). The fork leaves behind
what a new interpreter would not have: the rank's signal handlers and stop flag, its random
states, its `sys.path` entry for the launcher; the child drops or renews them before the script
runs, and leaves as the interpreter would (non-daemon threads joined, exit handlers run). The exit
handlers it inherits are its imports' (logging's, multiprocessing's, torch's DataLoader's), which
the script's own imports would have registered: the rank registers none of its own.

Under MPI the rank's process initialised an MPI library (threads of its own, memory an RDMA
device may have registered, which a fork must not touch): there the script starts anew.

The forked child is named `slurmddp-script` (/proc/PID/comm): how a local run's `interrupt` tells
a rank's script from the rank (manage/local_ranks.py), its command line being the rank's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping

from slurmddp.job.process import signals
from slurmddp.job.script import scriptrun

NAME = "slurmddp-script"
"""The forked script's process name (15 characters: the kernel keeps no more)."""
PR_SET_NAME = 15
WAIT_POLL_S = 0.01


class Started:
    """The script's process, as the rank uses it: its status once it ended (`returncode`: the
    exit code, or minus the signal that ended it, as subprocess gives them), signals to it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        # The start-hang follower polls from its thread while the main thread waits.
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Its status once it ends within `timeout` seconds, else None."""
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(WAIT_POLL_S)
        return code

    def send_signal(self, signum: int) -> None:
        # No poll here: this runs in signal handlers, which may interrupt the main thread's poll.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: list[str], env: Mapping[str, str], fork: bool) -> Started:
    """Start the script (`argv`: SCRIPT ARGS... or -m MODULE ARGS...) with `env` added to this
    process's environment: forked (see the module's doc), or, with `fork` False, anew."""
    if not fork:
        command = [sys.executable, "-m", "slurmddp.job.script.scriptrun", *argv]
        return Started(os.posix_spawn(sys.executable, command, {**os.environ, **env}))
    # What this process printed so far must not be printed again by the child.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _as_a_new_interpreter(env)
            code = _run_as_python(argv)
        finally:
            os._exit(code)
    return Started(pid)


def _as_a_new_interpreter(env: Mapping[str, str]) -> None:
    """Drop what the rank's process set up and a new interpreter would not have."""
    for signum in signal.valid_signals():
        handler = signal.getsignal(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)
    signals.forget()
    os.environ.update(env)
    # `python -m` puts the working directory first on sys.path (scriptrun's own _run then puts a
    # script's folder there instead); the launcher's entry goes.
    sys.path[0] = os.getcwd()
    # A new interpreter seeds these from the system's entropy; forked, every restart of a rank
    # would draw the same numbers as the attempt before.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, NAME.encode(), 0, 0, 0)


def _run_as_python(argv: list[str]) -> int:
    """scriptrun's main, then the interpreter's exit: its status, as python's would be."""
    interrupted = False
    try:
        scriptrun.main(argv)
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # As Py_FinalizeEx: non-daemon threads first, then the exit handlers (where scriptrun's
    # Steps.at_exit may leave at once with 0).
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    if interrupted:
        # Python dies of the SIGINT it did not handle, so that its parent sees the signal.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_status(code: object) -> int:
    """The status python leaves with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr, flush=True)
    return 1
