"""Everything that runs inside an allocation: from the first line a task runs to the user's function and the
batch script's record of the attempt. Nothing here imports the login-node side (submit, manage, cli)."""
