"""What Slurm's commands print, captured on the lab cluster (Slurm 22.05.8, tests/slurm_lab), for the
tests of the pure parsers in slurmddp.cluster.slurm and of the checks built on them."""

from __future__ import annotations

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
