"""The run directory: its file names (layout) and one typed record per file, each with its read and
write. The batch script, the ranks and the login-node commands each read what another wrote, so
this is the only code that knows the files; it imports only the leaf helpers.

    layout      every file's name, and how a new run directory is named
    records     the attempt's records: progress, stop, failure, interrupt, attempts, exclusions, unwatched
    manifest    manifest.json and sweep.json: how a run or a sweep was submitted
    config      config.yaml: the resolved experiment
    metrics     metrics.jsonl: ctx.log's records
    outputs     result.json and preflight.json
    hangs       the watchdog's reports under hangs/
    probe       doctor --probe's records under probe/
    trackers    trackers.json: the trackers' run ids
    ddp         ddp/N.json: a script's DDP bucket layouts
    watchkey    .watch-key: the run's secret for the peer watch
"""
