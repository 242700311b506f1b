"""slurmddp: one-command multi-node PyTorch DDP on Slurm, resilient to preemption.

Importing the package stays light (no torch): it runs on login nodes that may lack torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
