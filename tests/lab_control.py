"""The lab's daemons taken down and brought back under a running job: `slurmd` of one node, and
`slurmctld`, found through the lab's own PID files (tests/slurm_lab/up writes them), started again
the way `up` starts them. Nothing here touches a process the lab did not start."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conftest import slurm_command

OUT_OF_SERVICE = {"down", "drain", "drng", "fail"}
"""sinfo's short states of a node no new job gets."""


@dataclass(frozen=True)
class LabDaemons:
    """One running lab, as the environment `up` printed (SLURM_CONF, the node namespaces' prefix)
    names it."""

    env: Mapping[str, str]

    @property
    def conf(self) -> Path:
        return Path(self.env["SLURM_CONF"])

    @property
    def state_dir(self) -> Path:
        """The lab's directory: etc/slurm.conf, run/*.pid, log/*.log, and for 24.11 sbin/."""
        return self.conf.parent.parent

    def daemon_env(self) -> dict[str, str]:
        """The environment `up` starts daemons with: for 24.11, its wrappers (sbin/) run them from
        the lab's own root."""
        sbin = self.state_dir / "sbin"
        path = self.env.get("PATH", "")
        return {**self.env, "PATH": f"{sbin}:{path}" if sbin.is_dir() else path}

    def pid(self, name: str) -> int:
        """The live PID in run/NAME.pid (`slurmctld`, `slurmd-node1`), checked to be that daemon."""
        pid = int((self.state_dir / "run" / f"{name}.pid").read_text().strip())
        comm = name.split("-", 1)[0]
        if not alive(pid) or Path(f"/proc/{pid}/comm").read_text().strip() != comm:
            raise ProcessLookupError(f"run/{name}.pid names {pid}, which is not a live {comm}")
        return pid

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL: the node's job steps (slurmstepd) live on without it."""
        pid = self.pid(f"slurmd-{node}")
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)

    def start_slurmd(self, node: str) -> None:
        """As `up` starts it: in the node's network namespace, with its hostname and hosts file."""
        netns = f"/run/netns/{self.env['SLURMDDP_LAB_NETNS_PREFIX']}{node}"
        inner = 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -f "$3"'
        hosts = self.state_dir / "etc" / "hosts"
        command = ["nsenter", f"--net={netns}", "unshare", "--uts", "--mount", "sh", "-c", inner]
        self._spawn([*command, "sh", str(hosts), node, str(self.conf)], f"slurmd-{node}")
        self._wait_alive(f"slurmd-{node}")

    def restart_slurmctld(self) -> None:
        """SIGTERM (it saves its state), then start it again; returns once `scontrol ping` answers."""
        pid = self.pid("slurmctld")
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid)
        self._spawn(["slurmctld", "-f", str(self.conf)], "slurmctld")
        self._wait_alive("slurmctld")
        deadline = time.monotonic() + 30
        while "is UP" not in self._run("scontrol", "ping"):
            if time.monotonic() > deadline:
                raise TimeoutError("slurmctld does not answer `scontrol ping` 30 s after its restart")
            time.sleep(0.2)

    def resume_nodes(self, timeout: float = 60) -> None:
        """Nodes a fault left down or drained back in service, so the next trial (or test) has all
        three; returns once none is out of service. An unchecked `scontrol update` under load once
        left a node out, and the next test's sbatch was refused for it."""
        deadline = time.monotonic() + timeout
        while out := self._out_of_service():
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes still out of service {timeout:.0f} s after their resume: {out}")
            for node in out:
                self._run("scontrol", "update", f"nodename={node}", "state=resume")
            time.sleep(0.5)

    def _out_of_service(self) -> dict[str, str]:
        listed = self._run("sinfo", "-h", "-N", "-o", "%N %t", check=True).split("\n")
        states = dict(line.split() for line in listed if line.strip())
        return {node: state for node, state in states.items() if state.rstrip("*~#$@") in OUT_OF_SERVICE}

    def _spawn(self, command: list[str], name: str) -> None:
        """The daemon detaches itself; its output goes to its log, as with `up`."""
        log = self.state_dir / "log" / f"{name}.log"
        with log.open("a") as out:
            subprocess.run(
                command, env=self.daemon_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=True
            )

    def _wait_alive(self, name: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.pid(name)
                return
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} did not start: see {self.state_dir}/log/{name}.log") from None
                time.sleep(0.1)

    def _run(self, *command: str, check: bool = False) -> str:
        proc = slurm_command(command, self.env, check=check)
        return proc.stdout + proc.stderr


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: orphans here may be reaped late)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still runs {timeout:.0f} s after its signal")
        time.sleep(0.05)
