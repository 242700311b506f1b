"""The errors slurmddp reports to users: each says what was wrong, where, and what to do."""

from __future__ import annotations


class SlurmddpError(Exception):
    """Base of every error slurmddp shows to a user (the CLI prints it without a traceback)."""


class ConfigError(SlurmddpError):
    """The experiment, a profile or an override is wrong."""


class HostlistError(SlurmddpError):
    """A Slurm hostlist expression that Slurm itself would reject."""


class SubmitError(SlurmddpError):
    """Slurm (or the local executor) refused or lost the job."""


class DistEnvError(SlurmddpError):
    """The environment of a rank does not describe a usable distributed job."""


class PreflightError(SlurmddpError):
    """A node failed the job-start check: its device, a wrong all-reduce sum, or a slow network."""
