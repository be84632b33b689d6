"""irrev's shell: the `irrev` command, its subcommands, and the harness that runs the
libraries (ledger, pricing, gateway, sim) as processes for demos, benchmarks, load and
the fault matrix. Nothing in the libraries imports it."""
