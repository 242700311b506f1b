"""slurmddp.cluster.slurm: the pure parsers of what Slurm's commands print, from text (no cluster
needed), and what the runners make of an answer, with the command replaced by a recording fake."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest
from slurm_samples import LAB

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import as_state, parse_config, parse_job_fields, parse_states

# `scontrol show job -o 57` for task 1 of array job 56 on Slurm 22.05.8, after two requeues: one line,
# space-separated KEY=VALUE words, some values holding '=' or ':' themselves.
ARRAY_TASK = (
    "JobId=57 ArrayJobId=56 ArrayTaskId=1 JobName=sweep UserId=root(0) GroupId=root(0) MCS_label=N/A "
    "Priority=1 Nice=0 Account=(null) QOS=normal JobState=RUNNING Reason=None Dependency=(null) "
    "Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:41 TimeLimit=00:10:00 "
    "TimeMin=N/A SubmitTime=2026-11-22T04:20:01 EligibleTime=2026-11-22T04:20:11 "
    "AccrueTime=2026-11-22T04:20:11 StartTime=2026-11-22T04:20:12 EndTime=2026-11-22T04:30:12 "
    "Deadline=N/A PreemptEligibleTime=2026-11-22T04:20:12 PreemptTime=None SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-22T04:20:12 Scheduler=Main Partition=debug "
    "AllocNode:Sid=vm:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList=node[1-2] BatchHost=node1 "
    "NumNodes=2 NumCPUs=4 NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,mem=2000M,node=2,billing=4 "
    "Socks/Node=* NtasksPerN:B:S:C=2:0:*:* CoreSpec=* MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/runs/sweep/20261122-042001-ab12/logs/56_submission.sh WorkDir=/work "
    "StdErr=/runs/sweep/20261122-042001-ab12/logs/56_1_0_log.err StdIn=/dev/null "
    "StdOut=/runs/sweep/20261122-042001-ab12/logs/56_1_0_log.out Power="
)


# ---- scontrol show config ----


def test_parse_config_keeps_keys_and_values_and_skips_other_lines() -> None:
    parsed = parse_config(LAB)
    assert parsed["SlurmctldParameters"] == "preempt_send_user_signal"
    assert parsed["KillWait"] == "10 sec" and parsed["SLURM_VERSION"] == "22.05.8"
    assert parsed["MaxArraySize"] == "1001" and parsed["PreemptMode"] == "REQUEUE"
    assert parsed["AllowedRAMSpace"] == "100.0%"
    assert not any(" " in key for key in parsed)
    assert "Configuration data as of 2026-11-22T04:17:56" not in parsed
    assert not any(key.startswith(("Cgroup", "Slurmctld(")) for key in parsed)


def test_parse_config_first_occurrence_wins() -> None:
    later = LAB + "\nSome Other Section:\nKillWait                = 99 sec\n"
    assert parse_config(later)["KillWait"] == "10 sec"
    assert parse_config("") == {}


# ---- squeue and sacct states ----


def test_parse_states_reads_id_state_lines() -> None:
    text = (
        "41|REQUEUED\n"  # sacct: one line per allocation of a requeued job, the newest last
        "41|COMPLETED\n"
        "42|CANCELLED by 0\n"
        "12_3|RUNNING\n"
        "12_4|PENDING\n"
        "\n"
        "43|NOT_A_STATE\n"
        "44|\n"
    )
    assert parse_states(text) == {
        "41": "COMPLETED",
        "42": "CANCELLED",
        "12_3": "RUNNING",
        "12_4": "PENDING",
        "43": "UNKNOWN",
        "44": "UNKNOWN",
    }


def test_parse_states_a_later_line_wins_whatever_its_state() -> None:
    assert parse_states("41|COMPLETED\n41|REQUEUED\n") == {"41": "REQUEUED"}
    assert parse_states("") == {}


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("RUNNING", "RUNNING"),
        ("CANCELLED by 1000", "CANCELLED"),
        ("  TIMEOUT \n", "TIMEOUT"),
        ("running", "UNKNOWN"),  # Slurm spells states in capitals; anything else is not one
        ("COMPLETE", "UNKNOWN"),
        ("", "UNKNOWN"),
    ],
)
def test_as_state(text: str, state: str) -> None:
    assert as_state(text) == state


# ---- scontrol show job -o ----


def test_parse_job_fields_of_an_array_task() -> None:
    fields = parse_job_fields(ARRAY_TASK + "\n")
    assert (fields["JobId"], fields["ArrayJobId"], fields["ArrayTaskId"]) == ("57", "56", "1")
    assert fields["Restarts"] == "2" and fields["JobState"] == "RUNNING"
    assert fields["NodeList"] == "node[1-2]" and fields["PreemptTime"] == "None"
    # A value is everything after the first '='.
    assert fields["TRES"] == "cpu=4,mem=2000M,node=2,billing=4"
    assert fields["AllocNode:Sid"] == "vm:4242" and fields["ExitCode"] == "0:0"
    assert fields["Power"] == ""
    assert "cpu" not in fields and "mem" not in fields


def test_parse_job_fields_cuts_a_value_at_a_space_and_keeps_the_first_key() -> None:
    fields = parse_job_fields("JobId=7 Comment=two words JobId=8 Restarts=0")
    assert fields == {"JobId": "7", "Comment": "two", "Restarts": "0"}
    assert parse_job_fields("") == {}


# ---- the runners, with a fake command ----


@pytest.fixture
def answer(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[str]], dict[str, tuple[int, str, str]]]:
    """Replace slurm.run: commands are recorded, and answered from the second dict ({argv[0]:
    (status, stdout, stderr)})."""
    calls: list[list[str]] = []
    replies: dict[str, tuple[int, str, str]] = {}

    def fake_run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        status, out, err = replies[args[0]]
        return subprocess.CompletedProcess(list(args), status, out, err)

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls, replies


@pytest.mark.parametrize(
    ("status", "printed", "expected"),
    [
        (0, "2026-11-22T04:21:07\n", "2026-11-22T04:21:07"),
        (0, "None\n", None),  # signalled for its time limit: slurmctld set no PreemptTime
        (0, "N/A\n", None),
        (0, "", None),
        (1, "", None),  # gone from the queue
    ],
)
def test_preempt_time(
    answer: tuple[list[list[str]], dict[str, tuple[int, str, str]]],
    status: int,
    printed: str,
    expected: str | None,
) -> None:
    calls, replies = answer
    replies["squeue"] = (status, printed, "" if status == 0 else "slurm_load_jobs error: Invalid job id")
    assert slurm.preempt_time("56_1") == expected
    assert calls == [["squeue", "-h", "-j", "56_1", "-O", "PreemptTime"]]


def test_max_array_size(answer: tuple[list[list[str]], dict[str, tuple[int, str, str]]]) -> None:
    _, replies = answer
    replies["scontrol"] = (0, LAB, "")
    assert slurm.max_array_size() == 1001
    replies["scontrol"] = (1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")
    assert slurm.max_array_size() is None


def test_job_states_asks_sacct_only_for_what_left_the_queue(
    answer: tuple[list[list[str]], dict[str, tuple[int, str, str]]],
) -> None:
    calls, replies = answer
    replies["squeue"] = (0, "40_1|RUNNING\n", "")
    replies["sacct"] = (0, "40_0|COMPLETED\n40_1|REQUEUED\n", "")
    assert slurm.job_states(["40_0", "40_1"]) == {"40_0": "COMPLETED", "40_1": "RUNNING"}
    assert [call[0] for call in calls] == ["squeue", "sacct"] and calls[0][4] == "40"
    calls.clear()
    assert slurm.job_states(["40_1"]) == {"40_1": "RUNNING"}
    assert [call[0] for call in calls] == ["squeue"]
    assert slurm.job_states([]) == {}


def test_node_events_name_the_nodes_that_went_down_since_the_attempt_began() -> None:
    # sacctmgr -n -P show event ... format=NodeName,TimeStart,State,Reason (22.05.8, the lab).
    text = (
        "|2026-11-23T05:07:30|Unknown||Cluster Registered TRES\n"
        "node3|2026-11-23T05:31:39|DOWN|slurmddp test\n"
        "node1|2026-11-23T04:00:00|DOWN|before the attempt\n"
        "node2|2026-11-23T05:40:00|DRAIN|admin drained it\n"
        "node4|2026-11-23T05:41:00|FAIL|\n"
    )
    # A drained node counts too: an admin (or a health check) took it out of service.
    assert slurm.parse_node_events(text, "2026-11-23T05:30:00") == {
        "node3": "DOWN: slurmddp test",
        "node2": "DRAIN: admin drained it",
        "node4": "FAIL",
    }


def test_node_states_name_the_nodes_down_now_once() -> None:
    # sinfo -h -N -n node[1-3] -o "%N|%T|%E": a node in two partitions is listed twice.
    text = (
        "node1|idle|none\nnode1|idle|none\n"
        "node2|down*|Not responding\nnode2|down*|Not responding\nnode3|drained|x\n"
    )
    assert slurm.parse_node_states(text) == {"node2": "DOWN*: Not responding", "node3": "DRAINED: x"}


@pytest.mark.parametrize(
    ("held", "updated", "expected"),
    [
        (0, 0, None),
        # Slurm requeued the job itself (NODE_FAIL): not running, so no hold, but a pending job
        # takes the update and needs no release.
        (1, 0, None),
        (1, 1, "requeuehold: Job is pending execution; excluding node2: Job has already finished"),
    ],
)
def test_requeue_excluding_updates_a_job_slurm_requeued_itself(
    monkeypatch: pytest.MonkeyPatch, held: int, updated: int, expected: str | None
) -> None:
    calls: list[list[str]] = []
    said = {"requeuehold": "Job is pending execution", "update": "Job has already finished"}

    def fake_run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        status = {"requeuehold": held, "update": updated}.get(args[1], 0)
        return subprocess.CompletedProcess(list(args), status, "", said.get(args[1], "") if status else "")

    monkeypatch.setattr(slurm, "run", fake_run)
    assert slurm.requeue_excluding("77", ["node2"]) == expected
    assert [call[1] for call in calls] == ["requeuehold", "update", *(["release"] if held == 0 else [])]


# ---- which failures are run again ----


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        ("slurm_load_jobs error: Socket timed out on send/recv operation", True),
        ("slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)", True),
        ("slurm_load_partitions error: Unable to contact slurm controller (receive failure)", True),
        ("squeue: error: slurm_receive_msg: Zero Bytes were transmitted or received", True),
        ("sbatch: error: Batch job submission failed: Slurm backup controller in standby mode", True),
        ("sacct: error: Problem talking to the database: Connection refused", True),
        # slurmdbd stopped (22.05.8): the same errno as MaxJobCount, below, but from slurmdbd.
        ("sacct: error: Problem talking to the database: Resource temporarily unavailable", True),
        ("sacctmgr: error: Sending PersistInit msg: Connection reset by peer", True),
        ("scontrol: error: slurm_send_node_msg: Transport endpoint is not connected", True),
        ("slurm_load_jobs error: Invalid job id specified", False),
        ("sacct: error: Slurm accounting storage is disabled", False),
        # MaxJobCount reached (22.05.8): it lasts until MinJobAge has passed, minutes.
        ("sbatch: error: Batch job submission failed: Resource temporarily unavailable", False),
        ("sbatch: error: invalid partition specified: nope", False),
        ("", False),
    ],
)
def test_transient(said: str, expected: bool) -> None:
    assert slurm.transient(said) is expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["squeue", "-h", "-j", "42", "-o", "%T"], True),
        (["sacct", "-X", "-n", "-P", "-j", "42", "-o", "State"], True),
        (["sinfo", "-h", "-o", "%P|%G|%c"], True),
        (["sacctmgr", "-n", "-P", "show", "event", "nodes=node1"], True),
        (["scontrol", "-o", "show", "partition"], True),
        (["scontrol", "update", "JobId=42", "ExcNodeList=node2"], True),
        (["scontrol", "release", "42"], True),
        (["scancel", "42", "43"], True),
        (["sbatch", "--test-only"], True),
        (["/opt/slurm/bin/squeue", "-h"], True),
        # A first try that reached slurmctld has acted: a second would act again.
        (["scontrol", "requeue", "42"], False),
        (["scontrol", "requeuehold", "42"], False),
        (["scancel", "--signal=USR2", "42"], False),
        (["scancel", "-s", "USR2", "42"], False),
        (["sbatch", "-p", "high", "--wrap", "sleep 3"], False),
        (["sacctmgr", "-i", "add", "account", "x"], False),
        (["srun", "hostname"], False),
    ],
)
def test_repeatable(args: list[str], expected: bool) -> None:
    assert slurm.repeatable(args) is expected


def test_may_retry_sends_again_what_cannot_have_arrived() -> None:
    signal = ["scancel", "--signal=USR2", "42"]
    read = ["squeue", "-h", "-j", "42"]
    timeout = "Socket timed out on send/recv operation"
    assert slurm.may_retry(read, timeout) and not slurm.may_retry(signal, timeout)
    for unsent in (
        "Unable to contact slurm controller (connect failure)",
        "Problem talking to the database: Connection refused",
        "Rate limit exceeded, please retry momentarily",
    ):
        assert slurm.may_retry(signal, unsent) and slurm.may_retry(read, unsent)
    assert not slurm.may_retry(read, "Invalid job id specified")


def sbatch_test_only(monkeypatch: pytest.MonkeyPatch, refusals: list[bool], states: list[str]) -> list[str]:
    """slurm.run replaced: `sbatch --test-only` refuses (NOT_AVAILABLE) or accepts in the order of
    `refusals`, `sinfo` answers the node states of `states` in turn; the commands run."""
    calls: list[str] = []

    def fake(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(args[0])
        if args[0] == "sinfo":
            return subprocess.CompletedProcess(list(args), 0, states.pop(0), "")
        refused = refusals.pop(0)
        said = f"allocation failure: {slurm.NOT_AVAILABLE}" if refused else ""
        return subprocess.CompletedProcess(list(args), int(refused), "", said)

    monkeypatch.setattr(slurm, "run", fake)
    return calls


def test_test_only_waits_for_the_nodes_a_restarted_slurmctld_does_not_know_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen on the 22.05 lab: slurmctld restarted, its nodes UNKNOWN for 4 s, and `sbatch
    --test-only` refused every job that sbatch itself queued."""
    calls = sbatch_test_only(monkeypatch, [True, True, False], ["unknown*\nunknown*\nidle", "unknown\nidle"])
    assert slurm.test_only("#!/bin/sh\n", pause=0) is None
    assert calls == ["sbatch", "sinfo", "sbatch", "sinfo", "sbatch"]


def test_test_only_refuses_at_once_where_every_node_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = sbatch_test_only(monkeypatch, [True], ["idle\nallocated\ndown*"])
    assert slurm.test_only("#!/bin/sh\n", pause=0) == f"allocation failure: {slurm.NOT_AVAILABLE}"
    assert calls == ["sbatch", "sinfo"]
