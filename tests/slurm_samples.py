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

# `sacct -D -X -n -P -o JobID,JobIDRaw,State,Submit,Start,End,ElapsedRaw,AllocTRES,CPUTimeRAW,NodeList`
# on the lab (22.05.8) for job 1 (2 CPUs, `scontrol requeue` after 3 s, then ran to the end) and
# array 2 (tasks 0 and 1, one CPU each; task 1 requeued once). With --duplicates the lines come in
# submit order, so a requeued job's allocations are interleaved with other jobs'; a requeued
# allocation's Submit is when it was requeued. The lines of array 9 are composed in the same shape:
# tasks 2-3 still pending (one summary line), and task 0 pending again after a requeue, which sacct
# shows as the REQUEUED allocation alone until the next one starts (seen on the lab).
SACCT_DUPLICATES = """\
1|1|REQUEUED|2026-11-22T22:36:31|2026-11-22T22:36:31|2026-11-22T22:36:34|3|billing=2,cpu=2,node=1|6|node1
2_0|3|COMPLETED|2026-11-22T22:36:31|2026-11-22T22:36:31|2026-11-22T22:36:35|4|billing=1,cpu=1,node=1|4|node1
2_1|2|REQUEUED|2026-11-22T22:36:31|2026-11-22T22:36:31|2026-11-22T22:36:34|3|billing=1,cpu=1,node=1|3|node1
1|1|COMPLETED|2026-11-22T22:36:34|2026-11-22T22:36:46|2026-11-22T22:36:52|6|billing=2,cpu=2,node=1|12|node1
2_1|2|COMPLETED|2026-11-22T22:36:34|2026-11-22T22:36:46|2026-11-22T22:36:50|4|billing=1,cpu=1,node=1|4|node1
9_0|10|REQUEUED|2026-11-22T22:38:00|2026-11-22T22:38:02|2026-11-22T22:38:32|30|billing=1,cpu=1,node=1|30|node3
9_[2-3]|9|PENDING|2026-11-22T22:38:00|Unknown|Unknown|0||0|None assigned
"""

# The same query on a cluster that accounts GPUs (AccountingStorageTRES=gres/gpu,gres/gpu:a100):
# AllocTRES names the GPUs once untyped and once per type. Job 7: two nodes x 4 GPUs, preempted
# after 600 s, waited 120 s, and is running again (End Unknown; sacct counts its elapsed to now).
SACCT_GPU = """\
7|7|PREEMPTED|2026-11-22T10:00:00|2026-11-22T10:00:05|2026-11-22T10:10:05|600|billing=64,cpu=64,gres/gpu:a100=8,gres/gpu=8,mem=500G,node=2|38400|gpu[01-02]
7|7|RUNNING|2026-11-22T10:10:05|2026-11-22T10:12:05|Unknown|300|billing=64,cpu=64,gres/gpu:a100=8,gres/gpu=8,mem=500G,node=2|19200|gpu[02-03]
"""
