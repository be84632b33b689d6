"""Fleet simulator: correlated procurement fleets, every admission gate side by side.

`experiments.EXPERIMENTS` names the experiments; `experiments.run_case` runs one case
(one common-random-numbers workload) through its arms; `irrev sim` is the CLI.
"""
