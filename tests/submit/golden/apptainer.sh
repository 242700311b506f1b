#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=1
#SBATCH --error=RUN_DIR/logs/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --job-name=apptainer-docker
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=RUN_DIR/logs/%j_0_log.out
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=120
#SBATCH --wckey=submitit

# setup
# slurmddp: the signals the ranks catch (acted on at the next step boundary, never fatal)
export SLURMDDP_STOP_SIGNALS=USR2,TERM
# Slurm 22.05 and 23.02: srun takes the job's --cpus-per-task from SRUN_CPUS_PER_TASK only, not
# from SLURM_CPUS_PER_TASK (NEWS 22.05.0rc1); 23.11 reads SLURM_CPUS_PER_TASK again.
export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"
# Slurm sends SIGTERM to the batch shell too (time limit, preemption without
# preempt_send_user_signal); surviving it lets the attempt record below run after srun returns.
trap 'echo "slurmddp: batch script got SIGTERM" >&2' TERM
# slurmddp: the in-memory snapshots (checkpoint.snapshot_every_steps) live in this folder of each
# node's memory; one task per node removes it when the job ends, at the SIGTERM Slurm sends every
# step then, and ignores the stop signals before it (requeue.signal: the time limit's, a
# preemption's). Started before the first step is placed: every node of the allocation, spares
# too. --no-kill: a node lost must not end the other nodes' tasks and with them their snapshots.
# The random part: another cluster's job of the same id may run beside this one (nodes shared by
# two Slurm installations, a job id used again), and each allocation starts afresh.
export SLURMDDP_SNAPSHOTS=/dev/shm/"slurmddp-$(id -u)/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}-$(cat /proc/sys/kernel/random/uuid)"
# --quiet: Slurm ends this step at the job's end, and srun said "Job step aborted" into rank 0's
# log at every healthy end (its errors it still writes).
command srun --overlap --no-kill --kill-on-bad-exit=0 --quiet --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
  --ntasks-per-node=1 --job-name=slurmddp-snapshots --output=/dev/null --error=/dev/null \
  bash -c 'trap "" USR1 USR2 INT HUP; trap "rm -rf \"\$SLURMDDP_SNAPSHOTS\"; exit 0" TERM; while :; do sleep 3600 & wait $!; done' &
export SLURMDDP_IN_JOB_RESTART=0
# slurmddp: each task of the training step stays for the allocation and forks its rank; a restart on
# the same nodes forks the next attempt's ranks in the same step (requeue.resident_launcher).
export SLURMDDP_RESIDENT=1
export SLURMDDP_RESIDENT_IMPORT=torch._dynamo
# torch reads some of the ranks' variables as it is imported (OMP_NUM_THREADS, TORCH_LOGS,
# TORCHDYNAMO_*), and each task imports it before it forks its rank.
export OMP_NUM_THREADS=1
slurmddp_place=$(PYTHON -m slurmddp.job.allocation.attempts begin RUN_DIR)
slurmddp_begin=$?
# 3: the run already ended for good (completed or out of budget); anything else non-zero: broken.
if [ "$slurmddp_begin" -eq 3 ]; then exit 0; elif [ "$slurmddp_begin" -ne 0 ]; then exit "$slurmddp_begin"; fi
eval "$slurmddp_place"
# slurmddp: the training step's srun runs in the background beside a watch that ends it once a node
# of the step is found silent: srun itself would wait for that node's tasks until Slurm calls the
# node down (SlurmdTimeout), long after every other rank ended. The peer watch knocks at slurmd's port.
export SLURMDDP_SLURMD_PORT="$(scontrol show config 2>/dev/null | sed -n 's/^SlurmdPort *= *//p')"
srun() {
  command srun "$@" &
  slurmddp_srun=$!
  PYTHON -m slurmddp.job.allocation.stepwatch RUN_DIR "$slurmddp_srun" &
  slurmddp_stepwatch=$!
  # A trapped signal (the TERM above) interrupts wait: wait again until srun itself has ended.
  while wait "$slurmddp_srun"; kill -0 "$slurmddp_srun" 2>/dev/null; do :; done
  kill -KILL "$slurmddp_stepwatch" 2>/dev/null
  # Reaped here, its end is not reported: bash would print "Killed" into every rank 0 log.
  wait "$slurmddp_stepwatch" 2>/dev/null
  wait "$slurmddp_srun"
}
# slurmddp: a failed attempt starts again as a new srun step of this allocation
# (requeue.in_job_restarts); the loop ends in the teardown.
while :; do

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output RUN_DIR/logs/%j_%t_log.out --error RUN_DIR/logs/%j_%t_log.err --kill-on-bad-exit=1 --overlap --export=ALL,SLURMDDP_SUBMITTED_WITH=0.1.0 apptainer exec --nv --bind RUN_DIR:RUN_DIR --bind REPO:REPO --pwd /workspace docker://pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime python3 -u -m slurmddp.job.launch.boot -u -m submitit.core._submit RUN_DIR/logs


# teardown
# slurmddp: record how the attempt ended; requeue it (preemption, time limit, failure in budget)
slurmddp_status=$?
PYTHON -m slurmddp.job.allocation.attempts end RUN_DIR "$slurmddp_status"
slurmddp_end=$?
# 4: restart inside this allocation; anything else: how the batch script ends.
if [ "$slurmddp_end" -ne 4 ]; then exit "$slurmddp_end"; fi
export SLURMDDP_IN_JOB_RESTART=$((SLURMDDP_IN_JOB_RESTART + 1))
slurmddp_place=$(PYTHON -m slurmddp.job.allocation.attempts begin RUN_DIR)
slurmddp_begin=$?
# 3: the run already ended for good (completed or out of budget); anything else non-zero: broken.
if [ "$slurmddp_begin" -eq 3 ]; then exit 0; elif [ "$slurmddp_begin" -ne 0 ]; then exit "$slurmddp_begin"; fi
eval "$slurmddp_place"
done