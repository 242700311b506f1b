"""The command line: argument parsing, the entry points, and errors turned into messages and exit statuses."""
