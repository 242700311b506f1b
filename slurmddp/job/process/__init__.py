"""A rank's process: environment, rendezvous, signals and the agreed stop, the watches for lost peers."""
