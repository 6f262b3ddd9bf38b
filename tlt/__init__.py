"""TLT's shared core: settings, tasks, models and the `tlt` command line."""

__version__ = "0.1.0"
