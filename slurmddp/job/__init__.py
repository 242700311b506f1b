"""Everything that runs inside an allocation, in rooms by where the code runs. Each room imports only
the rooms listed before it (tests/test_architecture.py), and none imports the login-node side
(submit, manage, cli):

    allocation/  the batch script, between srun steps: each attempt's begin and end, the requeue
                 rules, the step watch that ends a step whose node went silent
    checkpoint/  checkpoints that are either complete or ignored
    process/     a rank's process: its environment, the rendezvous, its signals and the agreed
                 stop, and the watches that find a dead, silent or hung peer
    train/       the training API a user's function gets: context, loop, loaders, sampler,
                 trackers, metrics, telemetry
    script/      script mode: a user's script run as a rank's child, its framework patched in
    launch/      a rank's start: boot (its first module), the runtime that drives it

`spec.py`, the picklable settings submit hands to every rank, sits below every room; `rank.py`, the
callable submit pickles, above them all.
"""
