"""Facts about Slurm and the machine: host lists, time syntax, fabric detection, and Slurm's commands."""
