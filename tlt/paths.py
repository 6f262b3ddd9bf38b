"""Where TLT keeps its bundled files."""

from pathlib import Path

BUNDLED_MODEL = Path(__file__).parent / "assets" / "tiny-gcd"
# EAGLE drafter of the bundled model, trained offline on its own samples (`tlt drafter train`).
BUNDLED_DRAFTER = Path(__file__).parent / "assets" / "tiny-gcd-drafter"
# The job `tlt run` runs without arguments: GRPO on the bundled model with its drafter.
BUNDLED_JOB = Path(__file__).parent / "assets" / "jobs" / "tiny-gcd.yaml"
# The same job with no trained drafter: spot workers train a fresh one in idle time.
BUNDLED_FRESH_JOB = Path(__file__).parent / "assets" / "jobs" / "tiny-gcd-fresh.yaml"
