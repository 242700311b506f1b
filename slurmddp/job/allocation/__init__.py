"""The batch script's side, between srun steps: attempts' begins and ends, requeue rules, step watch."""
