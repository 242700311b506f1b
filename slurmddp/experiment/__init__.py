"""The experiment: its schema, loading and layering, the sweep spec, and the checks of its entrypoint."""
