"""From an experiment to a submitted job: the pure SubmissionPlan, the batch script, the hand-off to
submitit."""
