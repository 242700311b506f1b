"""A rank's start: boot (the first module a task runs), the runtime that drives the rank, the probe."""
