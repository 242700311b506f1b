"""The cluster checks behind `doctor`: the reading of `scontrol show config` and its verdicts, from
text (no cluster needed)."""

from __future__ import annotations

from slurm_samples import LAB

from slurmddp.cluster.checks import FAIL, OK, WARN, Check, check_config, check_tools, examine, failed
from slurmddp.cluster.slurm import TOOLS, parse_config
from slurmddp.errors import SlurmCommandError


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def config(**changes: str) -> dict[str, str]:
    parsed = parse_config(LAB)
    parsed.update(changes)
    return parsed


def test_the_lab_is_all_ok() -> None:
    checks = check_config(parse_config(LAB))
    assert {check.status for check in checks} == {OK}
    names = [check.name for check in checks]
    assert names == [
        "preempt_send_user_signal",
        "PreemptMode/PreemptType",
        "JobRequeue",
        "MaxArraySize",
        "AccountingStorageType",
    ]


def test_missing_user_signal_warns_with_kill_wait_unless_no_preemption() -> None:
    check = by_name(check_config(config(SlurmctldParameters="(null)")))["preempt_send_user_signal"]
    assert check.status == WARN and "SIGTERM" in check.why and "KillWait (10 sec)" in check.why
    quiet = config(SlurmctldParameters="(null)", PreemptType="preempt/none")
    assert by_name(check_config(quiet))["preempt_send_user_signal"].status == OK


def test_newer_slurm_spells_it_in_preempt_parameters() -> None:
    newer = config(SlurmctldParameters="enable_configless", PreemptParameters="send_user_signal,strict_order")
    check = by_name(check_config(newer))["preempt_send_user_signal"]
    assert check.status == OK and "PreemptParameters=send_user_signal" in check.value


def test_preempt_modes() -> None:
    def mode(value: str) -> Check:
        return by_name(check_config(config(PreemptMode=value)))["PreemptMode/PreemptType"]

    assert mode("REQUEUE").status == OK
    assert mode("CANCEL").status == WARN and "GraceTime" in mode("CANCEL").why
    assert mode("SUSPEND,GANG").status == WARN and "suspended" in mode("SUSPEND,GANG").why
    off = by_name(check_config(config(PreemptType="preempt/none", PreemptMode="OFF")))
    assert off["PreemptMode/PreemptType"].status == OK


def test_requeue_arrays_and_accounting() -> None:
    checks = by_name(
        check_config(
            config(JobRequeue="0", MaxArraySize="0", AccountingStorageType="accounting_storage/none")
        )
    )
    assert checks["JobRequeue"].status == OK and "--requeue" in checks["JobRequeue"].why
    assert checks["MaxArraySize"].status == WARN
    assert checks["AccountingStorageType"].status == WARN and "UNKNOWN" in checks["AccountingStorageType"].why
    assert "0-1000" in by_name(check_config(config()))["MaxArraySize"].why


def test_missing_tools_fail_and_the_exit_says_so() -> None:
    found = {tool: f"/usr/bin/{tool}" for tool in TOOLS if tool != "sacct"}
    checks = check_tools(found)
    assert [c.status for c in checks] == [OK, OK, FAIL, OK, OK]
    assert failed(checks)


def test_an_unreachable_controller_fails() -> None:
    def show_config() -> str:
        raise SlurmCommandError(
            "scontrol show config: slurm_load_ctl_conf error: Unable to contact slurm controller"
        )

    found = examine(which=lambda tool: tool, show_config=show_config)
    assert failed(found.checks) and "Unable to contact" in found.checks[-1].value and found.config is None
