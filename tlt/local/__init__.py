"""Single-machine mode: every part as a local process (`tlt run`), the run's records and report."""
