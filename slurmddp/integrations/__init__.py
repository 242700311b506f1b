"""Preemption-safe training under the frameworks users bring, one module each, in the framework's
own idiom: each saves at the step every rank agreed to stop at (`slurmddp.should_stop()`,
job/process/stop.py), ends the attempt for a requeue, and resumes from the newest complete checkpoint.

    slurmddp.integrations.transformers   a TrainerCallback for HF transformers' Trainer
    slurmddp.integrations.lightning      a Callback for PyTorch Lightning's Trainer
    slurmddp.integrations.accelerate     save/resume helpers around HF accelerate's save_state
    slurmddp.integrations.checkpoints    a plain torchrun loop's atomic save and newest checkpoint
    slurmddp.integrations.shims          each framework's private internals, one pinned module each

Whether a checkpoint is complete is decided by one rule for all of them
(slurmddp/job/checkpoint/completeness.py); each module only says where its framework keeps the
checkpoints and which markers vouch for them.

Each imports its framework only when used; the frameworks are optional extras
(`pip install 'slurmddp[transformers]'`, ...).
"""
