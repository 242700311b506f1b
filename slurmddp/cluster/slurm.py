"""The one place that runs Slurm's commands (sbatch, squeue, sacct, scontrol, scancel) and reads
what they print. Parsing is done by pure functions of the text, so each Slurm release's output can
be tested without a cluster; the functions that run a command return plain values.

A command that fails for a reason outside the user's input (slurmctld down, a refused scancel)
raises SlurmCommandError; "that job is not in the queue" is an answer (None or ""), not an error.
A command that fails on a blip of slurmctld or slurmdbd (a timeout under load, a restart) is run
again for a while first (`run`, `may_retry`), where running it twice is safe.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import shutil
import signal as signals
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, cast, get_args

from slurmddp.cluster.generations import Version, parse_version
from slurmddp.cluster.timespec import parse_time
from slurmddp.errors import SlurmCommandError

TOOLS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")
JobState = Literal[
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "COMPLETING",
    "CONFIGURING",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PENDING",
    "PREEMPTED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "RESV_DEL_HOLD",
    "REVOKED",
    "RUNNING",
    "SIGNALING",
    "SPECIAL_EXIT",
    "STAGE_OUT",
    "STOPPED",
    "SUSPENDED",
    "TIMEOUT",
    "UNKNOWN",
]
"""A job's state as squeue and sacct spell it (UNKNOWN: what neither said)."""
JOB_STATES: frozenset[str] = frozenset(get_args(JobState))
# sacct's spelling of the states after which a job is still going somewhere.
_NOT_ENDED = frozenset({"RUNNING", "PENDING", "COMPLETING", "REQUEUED", "CONFIGURING"})
# What squeue prints for a job that slurmctld did not pick for preemption.
_NO_TIME = frozenset({"", "None", "N/A", "Unknown"})


def run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command and capture its output, run again while it fails on a blip of
    Slurm's daemons (`retrying`); a missing command is a SlurmCommandError."""
    return retrying(args, lambda: _run_once(args, stdin))


def _run_once(args: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(args), input=stdin, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {args[0]}: {exc}; is Slurm's bin directory on PATH?") from None


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stderr.strip() or proc.stdout.strip()


# ---- riding out a blip of slurmctld or slurmdbd ----

TRANSIENT_ERRORS: tuple[str, ...] = (
    # slurmctld took the request but did not answer within MessageTimeout: busy (seen from squeue on
    # the 24.11 lab under load, "slurm_load_jobs error: Socket timed out on send/recv operation").
    "Socket timed out on send/recv operation",
    # The connection closed before a whole message crossed it: a daemon restarting or overloaded.
    "Zero Bytes were transmitted or received",
    # SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR: no controller reachable
    # for now (a restart, a fail-over), after the client's own tries for MessageTimeout.
    "Unable to contact slurm controller",
    "Slurm backup controller in standby mode",
    "Controller is in standby mode",
    # slurmctld's rate limiting (SlurmctldParameters=rl_enable): "please retry momentarily".
    "Rate limit exceeded",
    # The sockets' own errors, talking to slurmctld or slurmdbd (one restarting, or swamped).
    "Connection refused",
    "Connection reset by peer",
    "Connection timed out",
    "Transport endpoint is not connected",
    "Communication connection failure",
    "Unable to connect to database",
    # sacct and sacctmgr when slurmdbd does not answer; a slurmdbd that is stopped makes them say
    # "Problem talking to the database: Resource temporarily unavailable" (22.05.8, after 45 s).
    "Problem talking to the database",
)
"""What Slurm's commands say when a daemon missed a request but may well answer a moment later.
Not "Resource temporarily unavailable": sbatch says it at MaxJobCount, which lasts minutes."""

UNDELIVERED_ERRORS: tuple[str, ...] = (
    "Unable to contact slurm controller (connect failure)",
    "Connection refused",
    "Slurm backup controller in standby mode",
    "Controller is in standby mode",
    "Rate limit exceeded",
)
"""The transient errors that prove the request was never acted on (no connection, or refused
unread): after them even a submission or a signal may be sent again. After a timeout the first
one may have been acted on, its answer lost."""

RETRY_S: float = 20
"""For how long after its first transient failure a command is run again: a restarting slurmctld
answers within seconds, a busy one may miss one more MessageTimeout, and a job's end
(attempts.end) asks squeue twice and must still requeue within its signal's lead."""
RETRY_FIRST_PAUSE_S: float = 0.5
RETRY_MAX_PAUSE_S: float = 5


def transient(said: str) -> bool:
    """Whether a failed Slurm command's message is a blip of slurmctld or slurmdbd (TRANSIENT_ERRORS)."""
    return _mentions(said, TRANSIENT_ERRORS)


def _mentions(said: str, errors: Iterable[str]) -> bool:
    lowered = said.lower()
    return any(error.lower() in lowered for error in errors)


def repeatable(args: Sequence[str]) -> bool:
    """Whether running a Slurm command twice does no more than running it once: reads, and the
    changes that set a state (scancel of a job, scontrol update and release). Not a submission, a
    signal (scancel --signal) or a requeue: a first try that reached slurmctld before its answer
    was lost has acted already, and a requeued job may be running again by the second."""
    tool = args[0].rsplit("/", 1)[-1] if args else ""
    rest = list(args[1:])
    if tool in ("squeue", "sacct", "sinfo"):
        return True
    if tool == "sacctmgr":
        return bool({"show", "list"} & set(rest))
    if tool == "sbatch":
        return bool({"--test-only", "--version"} & set(rest))
    if tool == "scancel":
        return not any(arg.startswith(("--signal", "-s")) for arg in rest)
    if tool == "scontrol":
        verb = next((arg for arg in rest if not arg.startswith("-")), "")
        return verb in ("show", "ping", "update", "release")
    return False


def may_retry(args: Sequence[str], said: str) -> bool:
    """Whether a Slurm command that failed saying `said` may be run again: the failure is
    transient, and either the command is repeatable or the request never reached the daemon."""
    return transient(said) and (repeatable(args) or _mentions(said, UNDELIVERED_ERRORS))


def retrying(
    args: Sequence[str],
    attempt: Callable[[], subprocess.CompletedProcess[str]],
    patience: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """`attempt()`, which runs the Slurm command `args`, again while it fails in a way `may_retry`
    allows, with pauses growing from RETRY_FIRST_PAUSE_S, for up to `patience` seconds (RETRY_S)
    after its first failure; its last answer, a failure too."""
    deadline: float | None = None
    pause = RETRY_FIRST_PAUSE_S
    while True:
        proc = attempt()
        if proc.returncode == 0 or not may_retry(args, _said(proc)):
            return proc
        # From the first failure, not the first try: a client that waited out MessageTimeout
        # (twice, for squeue on 22.05.8; 45 s for sacct) would otherwise leave no time to retry.
        now = time.monotonic()
        deadline = now + (RETRY_S if patience is None else patience) if deadline is None else deadline
        if now + pause > deadline:
            return proc
        time.sleep(pause)
        pause = min(2 * pause, RETRY_MAX_PAUSE_S)


def _checked(args: Sequence[str], stdin: str | None = None) -> str:
    proc = run(args, stdin)
    if proc.returncode != 0:
        raise SlurmCommandError(f"{' '.join(args)}: {_said(proc) or f'exit status {proc.returncode}'}")
    return proc.stdout


def available(tool: str = "sbatch") -> bool:
    """Whether a Slurm command is on PATH."""
    return shutil.which(tool) is not None


def installed() -> tuple[str, ...]:
    """Which of Slurm's commands (TOOLS) are on PATH: any one makes this a machine that submits to
    Slurm, which `executor: auto` never trains on."""
    return tuple(tool for tool in TOOLS if available(tool))


PING_TIMEOUT_S: float = 5
"""How long `scontrol ping` may take: a controller that answers does in milliseconds, while an
unreachable one keeps scontrol retrying for MessageTimeout (10 s by default) or longer."""


def controller_silence() -> str | None:
    """Why no Slurm controller answers (the last line `scontrol ping` said), or None when one does.
    Asked once, not `retrying`: the question is whether one answers now, and a controller that is
    down makes scontrol say so ("is DOWN"), not a transient error."""
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=PING_TIMEOUT_S)
    except OSError as exc:
        return f"cannot run scontrol: {exc}"
    except subprocess.TimeoutExpired:
        return f"no answer within {PING_TIMEOUT_S:g} s"
    # Each controller's line ("Slurmctld(primary) at ctl is DOWN") goes to stdout; with one down,
    # stderr adds a banner of asterisks ("** RESTORE SLURMCTLD DAEMON TO SERVICE **").
    said = proc.stdout.strip()
    # scontrol ping exits 0 only when every controller is UP; one UP (the primary or a backup) will do.
    if proc.returncode == 0 or re.search(r"\bis UP\b", said):
        return None
    lines = [line for line in f"{said}\n{proc.stderr}".splitlines() if line.strip(" *")]
    controllers = [line for line in lines if line.startswith("Slurmctld(")]
    return "; ".join(controllers or lines[-1:]) or f"exit status {proc.returncode}"


CONTROLLER_PATIENCE_S: float = 10
"""For how long a submission asks a silent controller again: a restarting slurmctld, or a backup
taking over, answers within seconds."""


def controller_unreachable(patience: float | None = None) -> str | None:
    """Why no Slurm controller answers (`controller_silence`), asked again with `retrying`'s pauses
    for up to `patience` seconds (CONTROLLER_PATIENCE_S) while the silence may pass: a controller
    that says it is DOWN, a transient error, no answer in time. None once one answers. A
    configuration scontrol cannot read (a wrong SLURM_CONF) is final at once."""
    deadline = time.monotonic() + (CONTROLLER_PATIENCE_S if patience is None else patience)
    pause = RETRY_FIRST_PAUSE_S
    while True:
        silence = controller_silence()
        if silence is None or not _may_pass(silence) or time.monotonic() + pause > deadline:
            return silence
        time.sleep(pause)
        pause = min(2 * pause, RETRY_MAX_PAUSE_S)


def _may_pass(silence: str) -> bool:
    return bool(re.search(r"\bis DOWN\b", silence)) or silence.startswith("no answer") or transient(silence)


# ---- sbatch ----


NOT_AVAILABLE = "Requested node configuration is not available"
REGISTER_WAIT_S: float = 60
"""How long `test_only` waits for nodes to register with a slurmctld that just started."""


def test_only(script: str, pause: float = 1.0) -> str | None:
    """Ask sbatch whether Slurm could ever run this batch script; its refusal, or None.

    Right after slurmctld starts (a restart, a fail-over), its nodes are UNKNOWN until their slurmd
    registers (4 s on the quiet 22.05 lab, longer under load), and `--test-only` refuses every job
    with NOT_AVAILABLE while sbatch itself queues them: that refusal counts once no node is
    UNKNOWN, or after REGISTER_WAIT_S."""
    deadline = time.monotonic() + REGISTER_WAIT_S
    while True:
        proc = run(["sbatch", "--test-only"], stdin=script)
        if proc.returncode == 0:
            return None
        said = _said(proc)
        if NOT_AVAILABLE not in said or not nodes_unregistered() or time.monotonic() + pause > deadline:
            return said
        time.sleep(pause)


def submit_after(command: str, after: str, options: Sequence[str]) -> str:
    """Queue the shell line `command` as a job that starts once job `after` ended, however it
    ended (an array: every task); its job id."""
    said = _checked(
        [
            "sbatch",
            "--parsable",
            f"--dependency=afterany:{after}",
            "--kill-on-invalid-dep=yes",
            *options,
            "--wrap",
            command,
        ]
    )
    return said.strip().split(";")[0]


def nodes_unregistered() -> bool:
    """Whether slurmctld holds nodes in state UNKNOWN (not registered since it started)."""
    proc = run(["sinfo", "-h", "-N", "-o", "%T"])
    return proc.returncode == 0 and any(state.lower().startswith("unknown") for state in proc.stdout.split())


# ---- scontrol ----


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` as {key: value}; the first occurrence of a key wins (later sections,
    such as the cgroup one, reuse no key of the main block we read)."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and " " not in key:
            config.setdefault(key, value.strip())
    return config


def show_config() -> str:
    """The text of `scontrol show config`; SlurmCommandError when slurmctld cannot be reached."""
    return _checked(["scontrol", "show", "config"])


def max_array_size() -> int | None:
    """The cluster's MaxArraySize: array task ids must be below it (Slurm's default is 1001).
    None when it cannot be read; sbatch then says so itself."""
    proc = run(["scontrol", "show", "config"])
    value = parse_config(proc.stdout).get("MaxArraySize", "") if proc.returncode == 0 else ""
    return int(value) if value.isdigit() else None


def parse_job_fields(text: str) -> dict[str, str]:
    """One job of `scontrol show job -o` as {key: value} (values with spaces are cut at the space;
    none of the fields read here has one)."""
    fields: dict[str, str] = {}
    for word in text.split():
        name, sep, value = word.partition("=")
        if sep:
            fields.setdefault(name, value)
    return fields


def job_fields(job_id: str) -> dict[str, str]:
    return parse_job_fields(_checked(["scontrol", "show", "job", "-o", job_id]))


def requeue(target: str) -> str | None:
    """`scontrol requeue TARGET`; what scontrol said when it refused, or None."""
    proc = run(["scontrol", "requeue", target])
    return None if proc.returncode == 0 else _said(proc)


def requeue_excluding(target: str, hosts: Sequence[str]) -> str | None:
    """Requeue TARGET to run anywhere but `hosts`: held while its excluded nodes are updated, so it
    cannot start again in between; what scontrol said when a step was refused, or None.

    Called from inside the job: the requeue SIGTERMs every process of the job, this one too, and
    slurmctld refuses to change a running job's ExcNodeList ("Job is no longer pending
    execution"). So SIGTERM is ignored until the job is released; Slurm's SIGKILL comes KillWait
    seconds later (seen on 22.05.8: the update is taken at once after requeuehold).
    """
    previous = signals.signal(signals.SIGTERM, signals.SIG_IGN)
    try:
        held = run(["scontrol", "requeuehold", target])
        # Also when the hold was refused: a job Slurm requeued itself (NODE_FAIL, a preemption in
        # REQUEUE mode) is pending already, and a pending job takes the update.
        update = run(["scontrol", "update", f"JobId={target}", f"ExcNodeList={','.join(hosts)}"])
        release = run(["scontrol", "release", target]) if held.returncode == 0 else held
    finally:
        signals.signal(signals.SIGTERM, previous)
    if update.returncode != 0:
        refused = "" if held.returncode == 0 else f"requeuehold: {_said(held)}; "
        return f"{refused}excluding {','.join(hosts)}: {_said(update)}"
    return None if release.returncode == 0 or held.returncode != 0 else _said(release)


def partition_nodes(partition: str | None) -> int | None:
    """How many nodes `partition` (None: the default one) has (scontrol's TotalNodes), or None
    when scontrol cannot say."""
    proc = run(["scontrol", "-o", "show", "partition", *([partition] if partition else [])])
    if proc.returncode != 0:
        return None
    lines = proc.stdout.splitlines()
    line = next((li for li in lines if partition or re.search(r"\bDefault=YES\b", li)), "")
    match = re.search(r"\bTotalNodes=(\d+)", line)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Partition:
    """One line of sinfo's summary of a partition (a partition whose nodes differ has several)."""

    name: str
    default: bool
    gpus_per_node: int
    cpus_per_node: int


def parse_partitions(text: str) -> list[Partition]:
    """`sinfo -h -o "%P|%G|%c"` -> partitions; sinfo marks the default one with a `*`."""
    found = []
    for line in text.splitlines():
        name, gres, cpus = [*line.strip().split("|"), "", ""][:3]
        if name:
            found.append(Partition(name.rstrip("*"), name.endswith("*"), gres_gpus(gres), _count(cpus)))
    return found


def gres_gpus(gres: str) -> int:
    """The GPUs per node in a Gres string: `gpu:8`, `gpu:a100:4(S:0-1),shard:8` -> 8, 4; 0 without."""
    for item in re.split(r",(?![^(]*\))", gres):
        kind, _, rest = item.partition(":")
        if kind == "gpu":
            count = rest.split("(")[0].rsplit(":", 1)[-1]
            return int(count) if count.isdigit() else 0
    return 0


def partitions() -> list[Partition]:
    """The cluster's partitions as sinfo lists them; [] when sinfo cannot say."""
    proc = run(["sinfo", "-h", "-o", "%P|%G|%c"])
    return parse_partitions(proc.stdout) if proc.returncode == 0 else []


# ---- node failures ----


def failed_nodes(nodes: Sequence[str], since: float) -> dict[str, str]:
    """The nodes among `nodes` that went down or failed since `since` (Unix time), each with its
    state and Slurm's reason: those down now (sinfo), and those the accounting's node events
    (sacctmgr show event) saw go down, which keep a node that has come back since
    (ReturnToService) but may lag slurmctld by a moment."""
    if not nodes:
        return {}
    start = dt.datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
    listed = ",".join(nodes)
    fields = "format=NodeName,TimeStart,State,Reason"
    found: dict[str, str] = {}
    try:
        events = run(["sacctmgr", "-n", "-P", "show", "event", f"nodes={listed}", f"start={start}", fields])
        states = run(["sinfo", "-h", "-N", "-n", listed, "-o", "%N|%T|%E"])
    except SlurmCommandError:
        return found
    if states.returncode == 0:
        found.update(parse_node_states(states.stdout))
    if events.returncode == 0:
        found.update(parse_node_events(events.stdout, start))
    return found


def _failed(state: str) -> bool:
    # A drained node finishes its jobs, but an admin took it out of service: no new step goes there.
    return state.upper().startswith(("DOWN", "FAIL", "DRAIN"))


def parse_node_events(text: str, since: str) -> dict[str, str]:
    """`sacctmgr -n -P show event format=NodeName,TimeStart,State,Reason` -> {node: "DOWN: reason"}
    for the down or failed events that began at or after `since` (the same ISO format)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        node, started, state, reason = [*line.split("|", 3), "", "", ""][:4]
        if node and started >= since and _failed(state):
            found[node] = f"{state}: {reason}" if reason else state
    return found


def parse_node_states(text: str) -> dict[str, str]:
    """`sinfo -h -N -o "%N|%T|%E"` -> {node: "down*: reason"} for the nodes down or failed now (a
    node in two partitions is listed twice)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        node, state, reason = [*line.split("|", 2), "", ""][:3]
        if node and _failed(state):
            # The accounting's spelling (DOWN), which sinfo writes in lower case.
            found[node] = f"{state.upper()}: {reason}" if reason and reason != "none" else state.upper()
    return found


@functools.cache
def version_text() -> str | None:
    """What `sbatch --version` prints (e.g. "slurm 22.05.8"), or None without Slurm; read once per
    process: what the batch script means depends on it (cluster.generations)."""
    try:
        proc = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


def version() -> Version | None:
    """The Slurm release of the sbatch on PATH, or None without one."""
    text = version_text()
    return None if text is None else parse_version(text)


# ---- squeue ----


def queued_field(job_id: str, field: str) -> str | None:
    """One squeue format field (`%T`, `%o`, ...) of a queued job; None once it left the queue
    (squeue exits non-zero with "Invalid job id" when slurmctld no longer knows the job)."""
    proc = run(["squeue", "-h", "-j", job_id, "-o", field])
    text = proc.stdout.strip()
    return text.splitlines()[0] if proc.returncode == 0 and text else None


def queue_state(job_id: str) -> JobState | None:
    """The job's state while it is queued or running (PENDING, RUNNING, ...), None once gone."""
    text = queued_field(job_id, "%T")
    return None if text is None else as_state(text)


def preempt_time(job_id: str) -> str | None:
    """When slurmctld picked the job for preemption, or None: it sets PreemptTime then, and a job
    signalled for its time limit has none (seen on 22.05.8)."""
    proc = run(["squeue", "-h", "-j", job_id, "-O", "PreemptTime"])
    text = proc.stdout.strip() if proc.returncode == 0 else ""
    return None if text in _NO_TIME else text


def time_left(job_id: str) -> float | None:
    """Seconds until the job's time limit, as squeue counts them now; None when unlimited or
    unknown."""
    proc = run(["squeue", "-h", "-j", job_id, "-O", "TimeLeft"])
    text = proc.stdout.strip() if proc.returncode == 0 else ""
    try:
        return parse_time(text)
    except ValueError:
        # parse_time refuses a zero limit; squeue prints 0:00 for a job at its limit.
        return 0.0 if re.fullmatch(r"[0:-]+", text) else None


def as_state(text: str) -> JobState:
    """A state word as printed ("CANCELLED by 0" is CANCELLED); anything else is UNKNOWN."""
    words = text.split()
    return cast(JobState, words[0]) if words and words[0] in JOB_STATES else "UNKNOWN"


def parse_states(text: str) -> dict[str, JobState]:
    """`ID|STATE` lines (squeue -o '%i|%T', sacct -P -o JobID,State) as {id: state}; a later line
    wins (sacct lists a requeued job once per allocation, newest last), and "CANCELLED by 0"
    reads as CANCELLED."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        job, _, state = line.partition("|")
        if job.strip():
            states[job.strip()] = as_state(state)
    return states


def job_states(job_ids: Iterable[str]) -> dict[str, JobState]:
    """The Slurm state of each job or array task id: squeue for what is queued, sacct for the rest.

    One call of each for any number of ids: `squeue -r` lists an array's tasks one per line, and
    sacct lists each task that ran as ARRAYID_TASK (22.05 has no `sacct --array`).
    """
    wanted = list(job_ids)
    if not wanted:
        return {}
    bases = ",".join(sorted({job.split("_")[0] for job in wanted}))
    queued = parse_states(run(["squeue", "-h", "-r", "-j", bases, "-o", "%i|%T"]).stdout)
    if all(job in queued for job in wanted):
        return queued
    ended = parse_states(run(["sacct", "-X", "-n", "-P", "-j", bases, "-o", "JobID,State"]).stdout)
    return {**ended, **queued}


# ---- sacct ----


def final_state(job_id: str, tries: int = 10) -> JobState:
    """The job's end state from accounting, which lags the job's end by a moment; UNKNOWN when
    accounting never says (a cluster without slurmdbd)."""
    for _ in range(tries):
        proc = run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"])
        states = [as_state(line) for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode == 0 and states and states[-1] not in _NOT_ENDED:
            return states[-1]
        if proc.returncode != 0 and transient(_said(proc)):
            # run() waited RETRY_S for slurmdbd already; the next tries would each wait as long.
            break
        time.sleep(1)
    return "UNKNOWN"


# ---- scancel ----


def cancel(job_ids: Sequence[str]) -> None:
    if job_ids:
        _checked(["scancel", *job_ids])


def cancel_pending(job_ids: Sequence[str]) -> None:
    """scancel the jobs' (an array's) tasks that have not started; the running ones go on."""
    if job_ids:
        _checked(["scancel", "--state=PENDING", *job_ids])


def cancel_queued(job_ids: Sequence[str]) -> None:
    """scancel those of the jobs still in the queue: one that ended a moment ago is no error."""
    proc = run(["scancel", *job_ids]) if job_ids else None
    if proc is not None and proc.returncode != 0:
        left = [job for job in job_ids if queue_state(job) is not None]
        if left:
            said = _said(proc) or f"exit status {proc.returncode}"
            raise SlurmCommandError(f"scancel {' '.join(left)}: {said}")


def cancel_quietly(job_id: str) -> None:
    """Best effort, for cleaning up after a check: the job may have ended by itself."""
    run(["scancel", job_id])


def signal(job_id: str, name: str) -> None:
    """Send SIG`name` to the job's step tasks: without --batch/--full, scancel reaches them only,
    as `sbatch --signal=SIG@T` does."""
    _checked(["scancel", f"--signal={name}", job_id])


# ---- sacct: accounting of every allocation ----

ACCOUNTING_FIELDS = (
    "JobID",
    "JobIDRaw",
    "State",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "CPUTimeRAW",
    "NodeList",
)
"""The columns `allocations` asks sacct for, in this order."""


@dataclass(frozen=True)
class Allocation:
    """One allocation of a job, as `sacct -D -X` lists it: a requeued job has one per time it ran."""

    job_id: str
    """sacct's JobID: "41", or "12_3" for task 3 of array 12."""
    raw_id: str
    """JobIDRaw: the SLURM_JOB_ID the allocation's processes saw (an array task has its own)."""
    state: JobState
    submit: float | None
    """Unix time; a requeued allocation's Submit is when the previous one was requeued."""
    start: float | None
    """None while it has not started."""
    end: float | None
    """None while it runs."""
    elapsed_s: int
    cpu_seconds: int
    """CPUTimeRAW: elapsed seconds x allocated CPUs, as Slurm counts them."""
    cpus: int
    gpus: int
    """The gres/gpu count in AllocTRES; 0 where the cluster does not account GPUs
    (AccountingStorageTRES without gres/gpu lists no GPU even for a job that has some)."""
    nodes: str
    """NodeList ("None assigned" before it starts)."""

    @property
    def gpu_seconds(self) -> int:
        return self.elapsed_s * self.gpus


def parse_tres(text: str) -> dict[str, str]:
    """A TRES list ("billing=4,cpu=4,gres/gpu=2,mem=8G,node=1") as {name: value}."""
    tres: dict[str, str] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep and name.strip():
            tres[name.strip()] = value.strip()
    return tres


def gpu_count(tres: dict[str, str]) -> int:
    """GPUs in a TRES list: `gres/gpu`, which a cluster that also accounts GPU types lists beside
    `gres/gpu:TYPE` for the same GPUs; the typed counts only when the untyped one is missing."""
    if "gres/gpu" in tres:
        return _count(tres["gres/gpu"])
    return sum(_count(value) for name, value in tres.items() if name.startswith("gres/gpu:"))


def parse_sacct_time(text: str) -> float | None:
    """A sacct time column (YYYY-MM-DDTHH:MM:SS, the machine's local time) as Unix time; None for
    "Unknown"/"None" (not started, still running) or another SLURM_TIME_FORMAT."""
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def parse_allocations(text: str) -> list[Allocation]:
    """`sacct -D -X -n -P -o ACCOUNTING_FIELDS` as allocations, in sacct's order (with -D: by
    submit time, so a requeued job's allocations are interleaved with other jobs'). Lines of
    another shape (a header, an error) are skipped."""
    allocations = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(ACCOUNTING_FIELDS) or not fields[1].strip().isdigit():
            continue
        job, raw, state, submit, start, end, elapsed, alloc_tres, cpu_time, nodes = (
            f.strip() for f in fields
        )
        tres = parse_tres(alloc_tres)
        allocations.append(
            Allocation(
                job_id=job,
                raw_id=raw,
                state=as_state(state),
                submit=parse_sacct_time(submit),
                start=parse_sacct_time(start),
                end=parse_sacct_time(end),
                elapsed_s=_count(elapsed),
                cpu_seconds=_count(cpu_time),
                cpus=_count(tres.get("cpu", "")),
                gpus=gpu_count(tres),
                nodes=nodes,
            )
        )
    return allocations


def allocations(job_ids: Iterable[str]) -> list[Allocation] | None:
    """Every allocation of each job or array task id, requeued ones included: without --duplicates
    sacct shows only a job's newest allocation (seen on 22.05.8). One sacct call for any number of
    ids. None when sacct cannot answer (a cluster without accounting), so that `status` still
    works there."""
    wanted = set(job_ids)
    if not wanted:
        return []
    bases = ",".join(sorted({job.split("_")[0] for job in wanted}))
    proc = run(["sacct", "-D", "-X", "-n", "-P", "-j", bases, "-o", ",".join(ACCOUNTING_FIELDS)])
    if proc.returncode != 0:
        return None
    return [a for a in parse_allocations(proc.stdout) if a.job_id in wanted]


def _count(text: str) -> int:
    return int(text) if text.isdigit() else 0
