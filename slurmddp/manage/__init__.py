"""What was submitted, read back from run directories and Slurm, and acted on: status, logs, cancel,
resubmit, results."""
