"""The training API a user's function gets: context, loop, loaders, sampler, trackers, metrics, telemetry."""
