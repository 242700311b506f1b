"""job/script/child.py: the script's process, forked from its rank's, starts and ends as a new
`python script.py` would (the rank's state left behind) and tells its end as subprocess would."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from slurmddp.job.process import signals
from slurmddp.job.script import child

pytestmark = pytest.mark.process


def run(tmp_path: Path, source: str, *args: str, fork: bool = True) -> int:
    script = tmp_path / "train.py"
    script.write_text(source)
    started = child.start([str(script), *args], {"SCRIPT_OUT": str(tmp_path / "out.json")}, fork=fork)
    code = started.wait(60)
    assert code is not None, "the script did not end"
    return code


def test_the_forked_script_has_none_of_the_ranks_handlers_random_state_or_path(tmp_path: Path) -> None:
    """What the rank set up before the fork (a signal handler, a received stop, random states,
    the launcher's sys.path entry) is not the script's."""
    before = signal.signal(signal.SIGHUP, lambda *_: None)
    signals._received = signal.SIGUSR2  # as if the rank had heard a stop before the fork
    state = random.getstate()
    try:
        code = run(
            tmp_path,
            "import json, os, random, signal, sys, torch\n"
            "from slurmddp.job.process import signals\n"
            "json.dump({'hup': signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,\n"
            "  'stopping': signals.stopping(), 'random': random.random(),\n"
            "  'torch': torch.initial_seed(), 'path0': sys.path[0], 'argv': sys.argv,\n"
            "  'name': open('/proc/self/comm').read().strip(), 'main': __name__},\n"
            "  open(os.environ['SCRIPT_OUT'], 'w'))\n",
            "--steps",
            "3",
        )
    finally:
        signal.signal(signal.SIGHUP, before)
        signals.forget()
    assert code == 0
    seen = json.loads((tmp_path / "out.json").read_text())
    random.setstate(state)
    assert seen["hup"] and not seen["stopping"]
    assert seen["random"] != random.random()
    assert seen["path0"] == str(tmp_path) and seen["argv"] == [str(tmp_path / "train.py"), "--steps", "3"]
    assert (seen["name"], seen["main"]) == (child.NAME, "__main__")


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "anew"])
@pytest.mark.parametrize(
    ("source", "status"),
    [
        ("raise SystemExit(3)", 3),
        ("raise SystemExit('bad arguments')", 1),
        ("raise ValueError('boom')", 1),
        ("raise KeyboardInterrupt", -signal.SIGINT),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ],
    ids=["exit-3", "exit-message", "exception", "interrupt", "killed"],
)
def test_the_status_is_what_python_would_leave_with(
    tmp_path: Path, source: str, status: int, fork: bool
) -> None:
    assert run(tmp_path, source, fork=fork) == status


def test_non_daemon_threads_end_before_the_exit_handlers_run(tmp_path: Path) -> None:
    """As the interpreter's end: a worker thread's last write comes before the script's atexit."""
    code = run(
        tmp_path,
        "import atexit, os, threading, time\n"
        "out = os.environ['SCRIPT_OUT']\n"
        "def work():\n"
        "    time.sleep(0.3)\n"
        "    open(out, 'a').write('thread\\n')\n"
        "atexit.register(lambda: open(out, 'a').write('atexit\\n'))\n"
        "threading.Thread(target=work).start()\n",
    )
    assert code == 0
    assert (tmp_path / "out.json").read_text() == "thread\natexit\n"


def test_a_still_running_script_waits_none_and_a_signal_reaches_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(60)\n")
    started = child.start([str(script)], {}, fork=True)
    assert started.wait(0.2) is None and started.poll() is None
    started.send_signal(signal.SIGTERM)
    assert started.wait(30) == -signal.SIGTERM
    started.kill()  # after its end: nothing to send to
    assert started.returncode == -signal.SIGTERM
