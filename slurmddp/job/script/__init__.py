"""Script mode: a user's script run as a rank's child, its framework patched in, its DDP layout kept."""
