"""`doctor`'s reading of `scontrol show config` and its verdicts, from text (no cluster needed)."""

from __future__ import annotations

import io
import subprocess

from slurmddp import doctor

# Excerpt of `scontrol show config` on Slurm 22.05.8 (the lab cluster), with its header and the
# trailing cgroup section and status line.
LAB = """\
Configuration data as of 2026-11-22T04:17:56
AccountingStorageHost   = 10.200.0.1
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = slurmddp
JobRequeue              = 1
KillWait                = 10 sec
MaxArraySize            = 1001
MpiDefault              = none
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
PreemptExemptTime       = 00:00:00
SlurmctldParameters     = preempt_send_user_signal
SLURM_VERSION           = 22.05.8

Cgroup Support Configuration:
AllowedRAMSpace         = 100.0%

Slurmctld(primary) at vm is UP
"""


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {check.name: check for check in checks}


def config(**changes: str) -> dict[str, str]:
    parsed = doctor.parse_config(LAB)
    parsed.update(changes)
    return parsed


def test_parse_keeps_keys_and_values_and_skips_other_lines() -> None:
    parsed = doctor.parse_config(LAB)
    assert parsed["SlurmctldParameters"] == "preempt_send_user_signal"
    assert parsed["KillWait"] == "10 sec" and parsed["SLURM_VERSION"] == "22.05.8"
    assert parsed["AllowedRAMSpace"] == "100.0%"
    assert not any(" " in key for key in parsed)
    assert "Configuration data as of 2026-11-22T04:17:56" not in parsed


def test_the_lab_is_all_ok() -> None:
    checks = doctor.check_config(doctor.parse_config(LAB))
    assert {check.status for check in checks} == {doctor.OK}
    names = [check.name for check in checks]
    assert names == [
        "preempt_send_user_signal",
        "PreemptMode/PreemptType",
        "JobRequeue",
        "MaxArraySize",
        "AccountingStorageType",
    ]


def test_missing_user_signal_warns_with_kill_wait_unless_no_preemption() -> None:
    check = by_name(doctor.check_config(config(SlurmctldParameters="(null)")))["preempt_send_user_signal"]
    assert check.status == doctor.WARN and "SIGTERM" in check.why and "KillWait (10 sec)" in check.why
    quiet = config(SlurmctldParameters="(null)", PreemptType="preempt/none")
    assert by_name(doctor.check_config(quiet))["preempt_send_user_signal"].status == doctor.OK


def test_newer_slurm_spells_it_in_preempt_parameters() -> None:
    newer = config(SlurmctldParameters="enable_configless", PreemptParameters="send_user_signal,strict_order")
    check = by_name(doctor.check_config(newer))["preempt_send_user_signal"]
    assert check.status == doctor.OK and "PreemptParameters=send_user_signal" in check.value


def test_preempt_modes() -> None:
    def mode(value: str) -> doctor.Check:
        return by_name(doctor.check_config(config(PreemptMode=value)))["PreemptMode/PreemptType"]

    assert mode("REQUEUE").status == doctor.OK
    assert mode("CANCEL").status == doctor.WARN and "GraceTime" in mode("CANCEL").why
    assert mode("SUSPEND,GANG").status == doctor.WARN and "suspended" in mode("SUSPEND,GANG").why
    off = by_name(doctor.check_config(config(PreemptType="preempt/none", PreemptMode="OFF")))
    assert off["PreemptMode/PreemptType"].status == doctor.OK


def test_requeue_arrays_and_accounting() -> None:
    checks = by_name(
        doctor.check_config(
            config(JobRequeue="0", MaxArraySize="0", AccountingStorageType="accounting_storage/none")
        )
    )
    assert checks["JobRequeue"].status == doctor.OK and "--requeue" in checks["JobRequeue"].why
    assert checks["MaxArraySize"].status == doctor.WARN
    assert (
        checks["AccountingStorageType"].status == doctor.WARN
        and "UNKNOWN" in checks["AccountingStorageType"].why
    )
    assert "0-1000" in by_name(doctor.check_config(config()))["MaxArraySize"].why


def test_missing_tools_fail_and_the_exit_says_so() -> None:
    found = {tool: f"/usr/bin/{tool}" for tool in doctor.TOOLS if tool != "sacct"}
    checks = doctor.check_tools(found)
    assert [c.status for c in checks] == [doctor.OK, doctor.OK, doctor.FAIL, doctor.OK, doctor.OK]
    assert doctor.failed(checks)


def test_examine_prints_every_check_from_a_fake_cluster() -> None:
    def which(tool: str) -> str | None:
        return f"/opt/slurm/bin/{tool}"

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        assert command == ["scontrol", "show", "config"]
        return subprocess.CompletedProcess(command, 0, LAB.replace("= REQUEUE", "= CANCEL"), "")

    out = io.StringIO()
    checks = doctor.examine(out, which=which, run=run)
    text = out.getvalue()
    assert text.startswith("slurmddp doctor: Slurm 22.05.8, cluster slurmddp\n")
    assert "  WARN  PreemptMode/PreemptType" in text and "/opt/slurm/bin/sacct" in text
    assert not doctor.failed(checks)


def test_an_unreachable_controller_fails() -> None:
    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            command, 1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller"
        )

    checks = doctor.examine(io.StringIO(), which=lambda tool: tool, run=run)
    assert doctor.failed(checks) and "Unable to contact" in checks[-1].value
