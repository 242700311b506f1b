"""The run directory: the names of the files in it and how a new one is named. One home for them,
because the batch script, the ranks and the login-node commands each read what another wrote.

    OUTPUT_DIR/NAME/YYYYmmdd-HHMMSS-xxxx/        a run (or a sweep, with one INDEX-HASH/ per element)
        config.yaml      the resolved experiment
        manifest.json    how it was submitted (a sweep has sweep.json instead)
        logs/            submitit's folder: batch script, pickles, one log per rank
        attempts.jsonl   every attempt's begin and end
        ...
"""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

CONFIG = "config.yaml"
MANIFEST = "manifest.json"
SWEEP = "sweep.json"
LOGS = "logs"
CHECKPOINTS = "checkpoints"
ATTEMPTS = "attempts.jsonl"
INTERRUPT = "interrupt.json"
"""`slurmddp interrupt`: which reason the signal it sent stands for."""
STOP = "stop.json"
"""Rank 0: the step every rank stopped at after a stop signal."""
FAILURE = "failure.json"
"""A rank's exception (or the preflight's verdict), for the failure budget."""
PROGRESS = "progress.json"
"""Rank 0: how far the loop got, refreshed every few seconds."""
SKIPPED_SAVES = "skipped_checkpoints.json"
"""Rank 0: the checkpoints the loop could not save (a full disk), counted over the run."""
SLOW_NODE = "slow_node.json"
"""Rank 0: the node found computing slower than the others (job/train/stragglers.py), or none."""
RESULT = "result.json"
TRIAL = "trial.json"
"""A `search:` sweep's element: the Optuna trial it runs, asked once, when it first started."""
METRICS = "metrics.jsonl"
"""Rank 0: every `ctx.log` record, one JSON object a line; a resumed attempt drops the records of
steps past its checkpoint first, so the file reads as one uninterrupted run."""
PERF = "perf/"
"""The prefix of the loop's own telemetry metrics in metrics.jsonl (job/train/telemetry.py): status shows
them as throughput, apart from the user's metrics."""
TENSORBOARD = "tensorboard"
"""Rank 0: TensorBoard event files of every attempt, one run across requeues."""
TRACKERS = "trackers.json"
"""The ids of the tracker runs (MLflow, W&B) that later attempts continue."""
SCRIPT_SAVES = "script_checkpoints.jsonl"
"""Rank 0 of a script: each checkpoint the script saved itself with torch.distributed.checkpoint
(job/script/saves.py), one JSON object a line: what `status` says and a resubmit resumes from."""
PREFLIGHT = "preflight.json"
PROVENANCE = "provenance"
NCCL_TRACE = "nccl_trace"
DDP_BUCKETS = "ddp"
"""A script's DDP gradient-bucket layouts, recorded for its later attempts (job/script/ddp_buckets.py)."""
EXCLUDED = "excluded.json"
"""Hosts the run leaves out, and why: for the rest of the run where confirmed (Slurm saw the node
go down, a failed check, a device error, a silent host), for one allocation where only suspected
(a node's ranks all died at once, a hang's culprit)."""
RESIDENT = "resident"
"""With requeue.resident_launcher: one folder an attempt that crashed, each task's report of how its
rank ended and task 0's verdict (job/launch/resident.py)."""
STEP_HOSTS = "hosts"
"""With spare nodes: one file an attempt, the hosts its srun step runs on (srun's SLURM_HOSTFILE)."""
WATCH_KEY = ".watch-key"
"""The run's secret (mode 0600): a connection to a rank's peer watch proves with it that it comes
from a rank of this run (rundir/watchkey.py)."""
UNWATCHED = "unwatched"
"""One file a rank (rank_N.json) whose peer watch could not start or stopped: status says so."""
HANGS = "hangs"
"""The watchdog's findings, one folder an attempt: every rank's stacks and where it was."""
PROBE = "probe"
"""`doctor --probe`: what each rank of the probe job saw."""
RESULTS_CSV = "results.csv"
STUDY_CSV = "study.csv"
"""`scale`: one row a size (throughput, speedup, efficiency, ...), beside sweep.json."""
STUDY_PNG = "study.png"


def new_run_dir(output_dir: str | Path, name: str, now: dt.datetime | None = None) -> Path:
    """OUTPUT_DIR/NAME/YYYYmmdd-HHMMSS-xxxx, absolute: the ranks run elsewhere."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return (Path(output_dir) / name / f"{stamp}-{secrets.token_hex(2)}").resolve()
