"""job/process/peerwatch.py: a rank that dies without a word ends every other rank of its step within
milliseconds; a rank that ends in order does not. Real sockets and a real TCPStore; the ranks
that die are real processes, SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import only_run, slurmddp
from dist_envs import dist_env
from torch._C._distributed_c10d import TCPStore

from slurmddp.job.process import liveness, peerwatch
from slurmddp.job.process.distenv import DistEnv
from slurmddp.rundir import watchkey
from slurmddp.rundir.records import AttemptId, Failure, Unwatched

HOSTS = ["node1", "node1", "node2", "node2"]
WAIT_S = 10.0
"""How long a test waits for what must happen; the watch itself answers in about GATHER_S."""

RANK_PROCESS = """
import sys, time
from datetime import timedelta
from pathlib import Path
from torch.distributed import TCPStore
from slurmddp.job.process import peerwatch
from slurmddp.rundir import watchkey
from slurmddp.job.process.distenv import DistEnv

rank, port, run_dir, hosts = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
world = len(hosts)
store = TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=30), wait_for_workers=False)
dist = DistEnv(rank, 0, world, 1, rank, world, "127.0.0.1", port, "7", 0, None)
watch = peerwatch.PeerWatch(
    store, dist, run_dir, hosts, lambda message: print("LOST", message, flush=True), watchkey.run_key(run_dir)
)
if rank:  # taken in by rank 0, and so watched, before it is killed
    watch._welcomed.wait(30)
print("READY", flush=True)
time.sleep(600)
"""


class Rank:
    """One rank's watch in this process; what it was told, once told."""

    def __init__(self, store: Any, rank: int, port: int, run_dir: Path) -> None:
        self.told = threading.Event()
        self.messages: list[str] = []
        dist = dist_env(
            rank=rank,
            local_rank=rank % 2,
            world_size=4,
            local_world_size=2,
            node_rank=rank // 2,
            num_nodes=2,
            master_addr="127.0.0.1",
            master_port=port,
            job_id="7",
        )
        self.dist: DistEnv = dist
        self.watch = peerwatch.PeerWatch(store, dist, run_dir, HOSTS, self._lost, watchkey.run_key(run_dir))

    def _lost(self, message: str) -> None:
        self.messages.append(message)
        self.told.set()


def spawn(rank: int, port: int, run_dir: Path, hosts: list[str] = HOSTS) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", RANK_PROCESS, str(rank), str(port), str(run_dir), *hosts],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "READY"
    return child


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def client(port: int) -> Any:
    return TCPStore("127.0.0.1", port, 4, False, timedelta(seconds=30), wait_for_workers=False)


def connected(ranks: list[Rank], children: int) -> None:
    """Wait until rank 0 has heard every other rank name itself."""
    deadline = time.monotonic() + WAIT_S
    while len([p for p in ranks[0].watch._peers.values() if p.rank is not None]) < len(ranks) - 1 + children:
        assert time.monotonic() < deadline, "the ranks never connected"
        time.sleep(0.01)


def following(rank: Rank) -> None:
    """Wait until rank 0 took a rank other than 0 in: a rank 0 killed before it answered looks, to
    that rank, like one that left in order first (PeerWatch._follow)."""
    assert rank.watch._welcomed.wait(WAIT_S), f"rank {rank.dist.rank} was never taken in"


def test_a_node_whose_ranks_are_killed_ends_every_other_rank_and_is_suspected(tmp_path: Path) -> None:
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), Rank(client(port), 1, port, tmp_path)]
    ranks[0].watch.step_of = lambda: 33  # rank 0's loop, in a job
    children = [spawn(2, port, tmp_path), spawn(3, port, tmp_path)]
    connected(ranks, 2)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    for rank in ranks:
        assert rank.told.wait(WAIT_S), f"rank {rank.dist.rank} was not told"
        assert rank.messages == [
            "rank 2 on node2, rank 3 on node2 ended without a word (killed: SIGKILL, the out-of-memory "
            "killer, a lost node), so the step cannot go on"
        ]
    failure = Failure.read_all(tmp_path)[-1]
    assert failure.rank == 2 and failure.step == 33
    assert failure.error == ranks[0].messages[0]
    assert failure.suspect_hosts == {"node2": "its 2 ranks died together while the other nodes' ran on"}


def test_rank_0_killed_ends_the_others(tmp_path: Path) -> None:
    port = free_port()
    master = spawn(0, port, tmp_path)
    ranks = [Rank(client(port), rank, port, tmp_path) for rank in (1, 2)]
    for rank in ranks:
        following(rank)
    os.kill(master.pid, signal.SIGKILL)
    master.wait()
    for rank in ranks:
        assert rank.told.wait(WAIT_S), f"rank {rank.dist.rank} was not told"
        assert rank.messages[0].startswith("rank 0 on node1 ended without a word")


def test_ranks_that_end_in_order_are_no_death(tmp_path: Path) -> None:
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), *(Rank(client(port), r, port, tmp_path) for r in (1, 2, 3))]
    connected(ranks, 0)
    for rank in ranks[1:]:
        rank.watch.leave()
        assert rank.watch._conn is not None
        rank.watch._conn.shutdown(socket.SHUT_RDWR)  # what the process's end does
    assert not ranks[0].told.wait(3 * peerwatch.GATHER_S)
    ranks[0].watch.leave()
    assert not any(rank.told.is_set() for rank in ranks)
    assert Failure.read_all(tmp_path) == []


def test_rank_0_ending_in_order_ends_the_watch_for_all(tmp_path: Path) -> None:
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), *(Rank(client(port), r, port, tmp_path) for r in (1, 2))]
    connected(ranks, 0)
    ranks[0].watch.leave()
    ranks[0].watch._server.close()
    assert not any(rank.told.wait(3 * peerwatch.GATHER_S) for rank in ranks[1:])


def test_a_rank_that_rank_0_never_took_in_is_not_told_of_a_death(tmp_path: Path) -> None:
    """A short script: rank 0 finished and left before another rank's watch connected. Its
    connection is refused, or dropped unanswered from the listen queue: no death either way."""
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    Rank(master, 0, port, tmp_path).watch.leave()
    late = Rank(client(port), 1, port, tmp_path)
    assert not late.told.wait(3 * peerwatch.GATHER_S)


def with_rank_3_killed(tmp_path: Path) -> list[Rank]:
    """Ranks 0 and 1 here; rank 3 a process, SIGKILLed once rank 0 took it in."""
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), Rank(client(port), 1, port, tmp_path)]
    child = spawn(3, port, tmp_path)
    connected(ranks, 1)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return ranks


def test_the_ranks_that_crashed_after_a_silent_death_are_not_blamed_for_it(tmp_path: Path) -> None:
    """Rank 3 is killed; rank 1's collective then fails on the closed socket, it records that and
    says so: the failure names rank 3 alone and replaces rank 1's consequence."""
    ranks = with_rank_3_killed(tmp_path)
    closed = "RuntimeError('Connection closed by peer')"
    Failure(12, 1, closed, AttemptId("7", 0), time.time()).write(tmp_path)
    ranks[1].watch.crashed()
    assert ranks[1].watch._conn is not None
    ranks[1].watch._conn.shutdown(socket.SHUT_RDWR)
    assert ranks[0].told.wait(WAIT_S)
    assert ranks[0].messages[0].startswith("rank 3 on node2 ended without a word")
    failure = Failure.read_all(tmp_path)[-1]
    assert failure.rank == 3 and failure.suspect_hosts is None
    assert failure.step == 12  # where the survivor's collective failed: the step rank 3 died at


def test_rank_0_crashing_on_a_dead_peer_first_records_that_death(tmp_path: Path) -> None:
    """Rank 0's own collective fails when rank 3 is killed: its crashed() waits the gathering
    window, so the failure names rank 3, and the other ranks are told so."""
    ranks = with_rank_3_killed(tmp_path)
    ranks[0].watch.crashed()
    assert not ranks[0].told.is_set()  # rank 0 ends by its own exception, not by being told
    assert ranks[1].told.wait(WAIT_S)
    assert ranks[1].messages[0].startswith("rank 3 on node2 ended without a word")
    assert Failure.read_all(tmp_path)[-1].rank == 3


def test_a_crash_alone_is_told_as_a_crash_and_its_record_stands(tmp_path: Path) -> None:
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), *(Rank(client(port), r, port, tmp_path) for r in (1, 2))]
    connected(ranks, 0)
    Failure(40, 2, "ValueError('bad batch')", AttemptId("7", 0), time.time()).write(tmp_path)
    ranks[2].watch.crashed()
    assert ranks[2].watch._conn is not None
    ranks[2].watch._conn.shutdown(socket.SHUT_RDWR)
    for rank in ranks[:2]:
        assert rank.told.wait(WAIT_S)
        assert rank.messages == [
            "rank 2 on node2 crashed (its error is in its log and failure.json), so the step cannot go on"
        ]
    assert [f.error for f in Failure.read_all(tmp_path)] == ["ValueError('bad batch')"]


def test_the_dead_ranks_own_crash_record_stands(tmp_path: Path) -> None:
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path)]
    child = spawn(3, port, tmp_path)
    connected(ranks, 1)
    own = Failure(step=12, rank=3, error="ValueError('bad batch')", attempt=AttemptId("7", 0), time=0.0)
    own.write(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert ranks[0].told.wait(WAIT_S)
    assert Failure.read_all(tmp_path)[-1].error == "ValueError('bad batch')"


@pytest.mark.parametrize(
    ("dead", "expected"),
    [
        ({2, 3}, {"node2"}),
        ({2}, set()),  # one rank of a node: its code as likely as the node
        ({0, 1, 2, 3}, set()),  # every node: the code, not a node
    ],
)
def test_a_node_is_suspected_only_when_its_ranks_alone_died(dead: set[int], expected: set[str]) -> None:
    assert set(peerwatch.suspects(HOSTS, dead)) == expected
    assert peerwatch.suspects(["a", "b", "c"], {1}) == {}  # one rank per node tells nothing


BLOCKS = {
    "c-call": "ctypes.CDLL(None).sleep(120)",
    # About 120 s of GPU cycles, then the host waits for them as a step's sync point does.
    "cuda-synchronize": "torch.cuda._sleep(int(2.4e11)); torch.cuda.synchronize()",
    "cuda-item": "x = torch.ones(1, device='cuda'); torch.cuda._sleep(int(2.4e11)); x.item()",
}


NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(
    "block",
    [
        "c-call",
        pytest.param("cuda-synchronize", marks=NEEDS_CUDA),
        pytest.param("cuda-item", marks=NEEDS_CUDA),
    ],
)
def test_a_rank_blocked_outside_python_is_ended_when_its_peer_dies(tmp_path: Path, block: str) -> None:
    """The case the watch is for: the survivor's main thread never returns to Python (a C call, a
    CUDA synchronize or a tensor's .item() waiting on the GPU, as an NCCL wait does), so neither
    an exception nor a signal handler can end it."""
    survivor = textwrap.dedent(
        """
        import ctypes, sys, torch
        from datetime import timedelta
        from pathlib import Path
        from torch.distributed import TCPStore
        from slurmddp.job.process import peerwatch
        from slurmddp.rundir import watchkey
        from slurmddp.job.process.distenv import DistEnv

        port, run_dir = int(sys.argv[1]), Path(sys.argv[2])
        store = TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30), wait_for_workers=False)
        dist = DistEnv(0, 0, 2, 1, 0, 2, "127.0.0.1", port, "7", 0, None)
        peerwatch.PeerWatch(
            store, dist, run_dir, ["node1", "node2"], peerwatch.end_process(0, lambda: None),
            watchkey.run_key(run_dir),
        )
        print("READY", flush=True)
        BLOCK
        print("still here", flush=True)
        """
    ).replace("BLOCK", BLOCKS[block])
    port = free_port()
    blocked = subprocess.Popen(
        [sys.executable, "-c", survivor, str(port), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert blocked.stdout is not None
    assert blocked.stdout.readline().strip() == "READY"
    peer = spawn(1, port, tmp_path, ["node1", "node2"])
    os.kill(peer.pid, signal.SIGKILL)
    peer.wait()
    out, err = blocked.communicate(timeout=60)
    assert blocked.returncode == peerwatch.PEER_LOST_EXIT_STATUS
    assert "still here" not in out
    assert "slurmddp: rank 0: rank 1 on node2 ended without a word" in err


KILLED_WHILE_OTHERS_BLOCK = """
import ctypes, os, signal
import torch
from slurmddp import RunContext

def train(ctx: RunContext) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in ctx.loop(10, model=model, optimizer=optimizer):
        if step == 4:
            if ctx.rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            ctypes.CDLL(None).sleep(600)  # as a rank blocked in a CUDA or NCCL wait
        optimizer.zero_grad()
        ddp(torch.ones(4, 8)).sum().backward()
        optimizer.step()
    return {}
"""


def test_three_local_ranks_end_at_once_when_one_is_killed_while_the_others_block(tmp_path: Path) -> None:
    """Without the watch, ranks 0 and 1 sit in their 600 s call, then fail in the next
    collective; with it the run has ended, its failure naming rank 2, within seconds of the kill."""
    (tmp_path / "killed.py").write_text(KILLED_WHILE_OTHERS_BLOCK)
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "entrypoint: killed.py:train\n"
        "resources: {nodes: 1, tasks_per_node: 3, time: '00:20:00'}\n"
        "dist: {hang_timeout_s: 0}\n"
    )
    started = time.monotonic()
    proc = slurmddp(
        dict(os.environ),
        tmp_path,
        "submit",
        str(exp),
        "executor=local",
        f"output_dir={tmp_path / 'runs'}",
        timeout=500,
    )
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    run = only_run(tmp_path / "runs")
    failure = Failure.read_all(run)[-1]
    assert failure.rank == 2 and failure.error.startswith("rank 2 on "), failure
    assert "ended without a word" in failure.error
    ends = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    assert ends[-1]["event"] == "end" and ends[-1]["status"] == peerwatch.PEER_LOST_EXIT_STATUS, ends[-1]
    assert took < 300, f"{took:.0f} s: the blocked ranks were not ended"


STRANGERS = [
    b"3\n",  # a bare rank number: the old protocol's "I am rank 3"
    b"GET / HTTP/1.1\r\nHost: node1\r\n\r\n",
    b"1 " + b"0" * 64 + b"\n",  # rank 1 with a made-up proof
    b"x" * (4 * peerwatch.MAX_LINE),  # no line at all
    b"\xff\xfe\x00\n\n\n",
]


def test_strangers_on_the_watch_port_are_dropped_and_the_watch_goes_on(tmp_path: Path) -> None:
    """Anyone on the cluster can reach the port: what they send counts for nothing, and a rank
    killed afterwards still ends the others within a second."""
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    ranks = [Rank(master, 0, port, tmp_path), Rank(client(port), 1, port, tmp_path)]
    child = spawn(3, port, tmp_path)
    connected(ranks, 1)
    watch_port = int(master.get(peerwatch.ADDRESS_KEY))
    # More strangers that say nothing and stay than rank 0 keeps: the oldest are dropped.
    lingering = [
        socket.create_connection(("127.0.0.1", watch_port)) for _ in range(peerwatch.MAX_UNPROVEN + 10)
    ]
    for said in STRANGERS:
        with socket.create_connection(("127.0.0.1", watch_port)) as stranger:
            stranger.sendall(said)
            time.sleep(0.05)
    assert not any(rank.told.wait(3 * peerwatch.GATHER_S) for rank in ranks)
    killed = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    for rank in ranks:
        assert rank.told.wait(WAIT_S), f"rank {rank.dist.rank} was not told"
    took = time.monotonic() - killed
    assert took < 1.0, f"{took:.2f} s"
    assert ranks[0].messages[0].startswith("rank 3 on node2 ended without a word")
    for stranger in lingering:
        stranger.close()


def test_a_port_that_cannot_prove_it_is_rank_0s_ends_no_rank(tmp_path: Path) -> None:
    """A stranger's server published as rank 0's watch: its "lost" is not believed."""
    port = free_port()
    master = TCPStore("127.0.0.1", port, 4, True, timedelta(seconds=30), wait_for_workers=False)
    fake = socket.create_server(("127.0.0.1", 0))
    master.set(peerwatch.ADDRESS_KEY, str(fake.getsockname()[1]))
    rank = Rank(client(port), 1, port, tmp_path)
    conn, _ = fake.accept()
    conn.sendall(b"hello 1234\n")
    assert conn.recv(200).startswith(b"1 ")  # the rank answered the challenge
    conn.sendall(b"ok " + b"0" * 64 + b"\nlost you are dead\n")
    assert not rank.told.wait(3 * peerwatch.GATHER_S)
    assert not rank.watch._welcomed.is_set()
    assert recorded(tmp_path) == [
        (1, "did not start: the port published as rank 0's watch did not prove it is rank 0's")
    ]
    conn.close()
    fake.close()


ATTEMPT = AttemptId("7", 0)


def recorded(run_dir: Path) -> list[tuple[int, str]]:
    """The ranks of ATTEMPT whose watch did not run, with what happened, once one is recorded (the
    watch's thread writes it), or none after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not (found := Unwatched.read_for(run_dir, ATTEMPT)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [(unwatched.rank, unwatched.what) for unwatched in found]


class FakeStore:
    """A store that cannot give the watch's address (`port` None: the store went away), or gives
    `port`."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port

    def get(self, key: str) -> bytes:
        if self.port is None:
            raise RuntimeError("the store went away")
        return str(self.port).encode()

    def set(self, key: str, value: str) -> None:
        raise AssertionError("only rank 0 publishes the address")


def watching(store: FakeStore, run_dir: Path) -> peerwatch.PeerWatch:
    """Rank 1's watch of a 2-rank attempt of job 7, rank 0 on this host."""
    dist = dist_env(rank=1, world_size=2, master_addr="127.0.0.1", job_id="7")
    return peerwatch.PeerWatch(store, dist, run_dir, ["node1", "node2"], print, watchkey.run_key(run_dir))


def test_a_rank_without_the_watchs_address_says_so_in_its_log_and_for_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watching(FakeStore(), tmp_path)
    error = "RuntimeError('the store went away')"
    assert f"slurmddp: rank 1: warning: no peer watch ({error})" in capsys.readouterr().err
    assert recorded(tmp_path) == [(1, f"could not start: the store has no watch address ({error})")]


def test_a_watch_whose_thread_raised_says_so_in_its_log_and_for_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(conn: socket.socket) -> None:
        raise ValueError("no keepalive here")

    monkeypatch.setattr(liveness, "keepalive", broken)
    with socket.create_server(("127.0.0.1", 0)) as rank_0:
        watching(FakeStore(rank_0.getsockname()[1]), tmp_path)
        found = recorded(tmp_path)
    error = "ValueError('no keepalive here')"
    assert found == [(1, f"stopped ({error})")]
    assert f"slurmddp: rank 1: warning: the peer watch stopped ({error})" in capsys.readouterr().err


def test_the_run_key_is_made_once_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    key = watchkey.run_key(tmp_path)
    assert watchkey.run_key(tmp_path) == key and len(key) == watchkey.KEY_BYTES
    assert (tmp_path / ".watch-key").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [".watch-key"]  # no temporary file left
