"""`doctor`'s reading of `scontrol show config` and its verdicts, from text (no cluster needed)."""

from __future__ import annotations

import io

import pytest
from slurm_samples import LAB

from slurmddp.cli import doctor
from slurmddp.cluster.slurm import TOOLS, parse_config
from slurmddp.errors import SlurmCommandError


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {check.name: check for check in checks}


def config(**changes: str) -> dict[str, str]:
    parsed = parse_config(LAB)
    parsed.update(changes)
    return parsed


def test_the_lab_is_all_ok() -> None:
    checks = doctor.check_config(parse_config(LAB))
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
    found = {tool: f"/usr/bin/{tool}" for tool in TOOLS if tool != "sacct"}
    checks = doctor.check_tools(found)
    assert [c.status for c in checks] == [doctor.OK, doctor.OK, doctor.FAIL, doctor.OK, doctor.OK]
    assert doctor.failed(checks)


@pytest.mark.process  # version() asks the Slurm on this machine
def test_examine_prints_every_check_from_a_fake_cluster() -> None:
    def which(tool: str) -> str | None:
        return f"/opt/slurm/bin/{tool}"

    def show_config() -> str:
        return LAB.replace("= REQUEUE", "= CANCEL")

    out = io.StringIO()
    checks = doctor.examine(out, which=which, show_config=show_config)
    text = out.getvalue()
    assert text.startswith("slurmddp doctor: Slurm 22.05.8, cluster slurmddp\n")
    assert "  WARN  PreemptMode/PreemptType" in text and "/opt/slurm/bin/sacct" in text
    assert not doctor.failed(checks)


def test_an_unreachable_controller_fails() -> None:
    def show_config() -> str:
        raise SlurmCommandError(
            "scontrol show config: slurm_load_ctl_conf error: Unable to contact slurm controller"
        )

    checks = doctor.examine(io.StringIO(), which=lambda tool: tool, show_config=show_config)
    assert doctor.failed(checks) and "Unable to contact" in checks[-1].value
