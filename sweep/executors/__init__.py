"""Executors decide where `python -m sweep.run <run_dir>` runs: locally, on SLURM or on Ray."""
