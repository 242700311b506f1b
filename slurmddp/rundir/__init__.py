"""The run directory: its file names (layout) and one typed record per file, each with its read and
write. The batch script, the ranks and the login-node commands each read what another wrote, so
this is the only code that knows the files; it imports only the leaf helpers."""
