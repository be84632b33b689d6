"""The `irrev` subcommands, one module each; irrev/cli.py imports only the one run."""
