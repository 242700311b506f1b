"""Every error slurmddp raises on purpose, and the exit status the CLI gives each.

Each message says what was wrong, where (file, key, host), and what to do. The CLI prints it
without a traceback and exits with the class's `exit_code`.
"""

from __future__ import annotations

EXIT_JOB_FAILED = 1
"""`submit --wait` and friends: the job (or an element of a sweep) did not complete."""
EXIT_USER_ERROR = 2
"""Something the user gave is wrong: the experiment, an override, an argument, a run reference."""
EXIT_SLURM_ERROR = 3
"""A Slurm command failed for a reason that is not the user's input (slurmctld down, scancel refused)."""
EXIT_INTERRUPTED = 130


class SlurmddpError(Exception):
    """Base of every error slurmddp shows to a user (the CLI prints it without a traceback)."""

    exit_code = EXIT_USER_ERROR


class ConfigError(SlurmddpError):
    """The experiment, a profile or an override is wrong."""


class HostlistError(SlurmddpError):
    """A Slurm hostlist expression that Slurm itself would reject."""


class SubmitError(SlurmddpError):
    """Slurm (or the local executor) refused the job as asked: it can never run as submitted."""


class SlurmCommandError(SlurmddpError):
    """A Slurm command (squeue, sacct, scontrol, scancel, sbatch) failed for a reason outside the
    user's input: slurmctld unreachable, a job that vanished between two calls."""

    exit_code = EXIT_SLURM_ERROR


class DistEnvError(SlurmddpError):
    """The environment of a rank does not describe a usable distributed job."""


class UntrustedPickle(SlurmddpError):
    """A rank's job pickle, or the folder it is in, could have been written by another user; the
    rank refuses to unpickle it (job/launch/trust.py)."""


class PreflightError(SlurmddpError):
    """A node failed the job-start check: its device, a wrong all-reduce sum, or a slow network."""


class EntrypointFailed(SlurmddpError):
    """The user's script ended with a non-zero exit status."""


class CheckpointError(SlurmddpError):
    """A checkpoint could not be written or read back."""


class SamplerStateError(SlurmddpError, ValueError):
    """A sampler was configured, advanced or restored with values that do not fit it."""
