"""Where the test suite's CPU goes, by test: samples /proc while a command runs (or until a process
ends) and prints the CPU seconds of each test's processes, the labs' daemons and the rest.

The suite is CPU-bound on 2 cores (four workers, each with labs of its own), so its wall time is
its CPU time over the cores: a test's wall time says little (it waits on the others), its CPU says
what it costs. A process counts for the test whose temporary directory (pytest's
`pytest-N/[popen-gwN/]NAME`, the name cut to 30 characters) is in its command line, environment
or working directory; a process that ends between two samples is counted through its parent's
children's time once the parent waited for it.

    python benchmarks/suite_cpu.py --out build/suite-cpu.md -- bash scripts/test.sh
    python benchmarks/suite_cpu.py --pid PID        # until PID ends (a run already going)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
TEST_DIR = re.compile(rb"/pytest-\d+/(?:popen-gw\d+/)?([A-Za-z0-9_]+?)\d*(?:/|$|\x00)")
DAEMONS = (b"slurmctld", b"slurmd", b"slurmstepd", b"slurmdbd", b"mariadbd", b"mysqld", b"munged")


def stat(pid: str) -> tuple[int, int, bytes] | None:
    """(ppid, own and waited-for children's CPU ticks, comm) of `pid`, or None where it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    comm = raw[raw.index(b"(") + 1 : raw.rindex(b")")]
    fields = raw[raw.rindex(b")") + 2 :].split()
    # After the comm: state, ppid, ... utime (12th), stime, cutime, cstime.
    return int(fields[1]), sum(int(f) for f in fields[11:15]), comm


def key_of(pid: str, comm: bytes) -> str:
    if comm in DAEMONS:
        return "lab daemons"
    for source in ("cmdline", "environ"):
        try:
            text = Path(f"/proc/{pid}/{source}").read_bytes()
        except OSError:
            continue
        if found := TEST_DIR.search(text):
            return found.group(1).decode()
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd").encode() + b"/"
    except OSError:
        cwd = b""
    if found := TEST_DIR.search(cwd):
        return found.group(1).decode()
    return f"other: {comm.decode(errors='replace')}"


def sample(until: subprocess.Popen[bytes] | int, every: float) -> tuple[Counter[str], float]:
    """CPU seconds by key until the command ends; the wall seconds it took."""
    spent: Counter[str] = Counter()
    seen: dict[str, tuple[int, int, str]] = {}  # pid: (ppid, ticks counted, key)
    began = time.monotonic()
    first = True  # what ran before the first sample is not the command's
    while True:
        now: dict[str, tuple[int, int, str]] = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            found = stat(pid)
            if found is None:
                continue
            ppid, ticks, comm = found
            # A key that names a test is kept; any other is looked for again: a rank seen between
            # slurmstepd's fork and its exec still has slurmstepd's name.
            known = seen.get(pid, (0, 0, "other: "))[2]
            key = known if not known.startswith(("other: ", "lab daemons")) else key_of(pid, comm)
            if not first:
                spent[key] += ticks - (seen[pid][1] if pid in seen else 0)
            now[pid] = (ppid, ticks, key)
        for pid, (ppid, ticks, _) in seen.items():
            if pid in now:
                continue
            # Gone: the nearest ancestor still here holds all of it in its children's time once
            # each one between waited (a rank and its srun step's processes end together), and
            # part of it was counted already.
            ancestor = str(ppid)
            while ancestor not in now and ancestor in seen:
                ancestor = str(seen[ancestor][0])
            if ancestor in now:
                spent[now[ancestor][2]] -= ticks
        seen, first = now, False
        if isinstance(until, subprocess.Popen):
            running = until.poll() is None
        else:
            running = Path(f"/proc/{until}").exists()
        if not running:
            return Counter({k: v / TICK for k, v in spent.items()}), time.monotonic() - began
        time.sleep(every)


def table(spent: Counter[str], wall: float, top: int) -> str:
    total = sum(spent.values())
    lines = [
        f"CPU {total:.0f} s in {wall:.0f} s of wall time ({total / max(wall, 1e-9):.2f} cores busy)",
        "",
        "| CPU (s) | share | test or process |",
        "|---:|---:|---|",
    ]
    for key, seconds in spent.most_common(top):
        lines.append(f"| {seconds:.0f} | {seconds / total:.1%} | {key} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pid", type=int, help="sample until this process ends")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("command", nargs="*")
    args = parser.parse_args()
    if (args.pid is None) == (not args.command):
        parser.error("give a command (after --) or --pid")
    until: subprocess.Popen[bytes] | int = args.pid
    if args.pid is None:
        until = subprocess.Popen(args.command)
    spent, wall = sample(until, args.every)
    text = table(spent, wall, args.top)
    sys.stdout.write(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return until.returncode if isinstance(until, subprocess.Popen) else 0


if __name__ == "__main__":
    raise SystemExit(main())
