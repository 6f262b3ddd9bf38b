"""Tasks with verifiable answers: problems, worked solutions and rewards."""

from tlt.tasks.gcd import GcdProblem, GcdTask

__all__ = ["GcdProblem", "GcdTask"]
