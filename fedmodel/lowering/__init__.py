"""Lowerings of the IR to other systems: CVXPY (exact solves) and sympy (rendering, checks)."""
from .to_cvxpy import to_cvxpy
from .to_sympy import to_sympy
