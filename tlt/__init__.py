"""TLT's shared core, one subpackage per concern: settings, store (Redis), jobs, rollout, rpc, local
(single-machine mode), speculation, drafter, models, tasks; and the `tlt` command line."""

__version__ = "0.1.0"
