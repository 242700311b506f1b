"""Sweeps that learn: the Optuna study of a `search:` sweep (study.py) and each element's trial
(trial.py), from its ask at the element's first start to the study being told how it ended.

Optuna is imported only here, and only for a search: the base install does without it.
"""
