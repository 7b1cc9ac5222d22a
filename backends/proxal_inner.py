"""ProxAL's default subproblem solver, `ProxAL(inner="auto")`: federated Newton steps
(`NewtonInner`, backends/proxal_newton.py) where they fit, Algorithm 2 (consensus ADMM)
otherwise, decided when the run starts. The rule (`newton_reading`) is the one
`backend="auto"` reads for its reasons too (backends/auto.py).

Newton steps fit a convex model (DCP: on a nonconvex one an indefinite Hessian gives no
descent) with no private variables but epigraph slacks, which their clients eliminate
(`proxal_newton_slacks`: the hinge SVM, pinball, LAD; β ×4, cap 1e6, `for_slacks`), no client prox term
but λ‖w‖₁, whose step's dense d × d matrices are within the dense Newton budget
(`proxal_newton_model.matrices_held`: n more where the executor gathers the clients' replies
before summing), on an executor that is not sum-only (secure aggregation bounds and quantizes
each entry of a sum: not measured with Hessians). Measured (docs/BENCHMARKS.md): bench_rounds'
ridge, logistic, ball and lasso rows 9–16 round trips against Algorithm 2's 24–49, NP monks-1
67 against 382, mnist-ball 24–27 against 194–819, all verified, and less CPU.

The default also runs Algorithm 2 where the caller gave one of Algorithm 2's own options
(`ADMM_OPTIONS`: they asked for the ADMM), and when NewtonInner refuses the run at its first
subproblem (a node's term the model's reading did not show; nothing ran yet). A checkpoint
records which inner wrote it, and a resumed default run takes that one (`InnerMismatch`).
`outcome.info["inner"]` says which ran and why.
"""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable

from fedmodel import registry
from fedmodel.compiler.canonical import classify_objective
from fedmodel.errors import FedModelError
from fedmodel.runtime import solvers
from fedmodel.runtime.checkpoint import CheckpointError
from .base import Backend
from .common import variable_sizes
from .outcome import Outcome
from .proxal_newton import NewtonInner
from .proxal_newton_model import matrices_held
from .proxal_newton_slacks import SLACK_BETAS, block_refusal

# the names `inner` takes besides a solver object ("admm" and None: Algorithm 2)
NAMES = ("auto", "admm", "newton")
# ProxAL's options only Algorithm 2 reads: one given explicitly makes the default Algorithm 2
ADMM_OPTIONS = ("rho", "rho_rule", "adaptive_rho", "anderson", "max_inner", "local_solver", "q",
                "inner_stall", "local_tol_cap", "client_sets", "client_constraints")
REFUSED = "ProxAL(inner=NewtonInner())"     # how NewtonInner's refusal begins (`solve_subproblem`)


class InnerMismatch(CheckpointError):
    """A checkpoint written by another inner solver than this run's (`ProxAL.loop`): `saved`
    names the one that wrote it."""

    def __init__(self, saved: str, running: str):
        super().__init__(f"the checkpoint was written by ProxAL with inner={saved!r}, this run takes "
                         f"inner={running!r}; resume with ProxAL(inner={saved!r})")
        self.saved = saved


def records_given(init: Callable) -> Callable:
    """ProxAL's constructor `init`, recording the names of the arguments its caller gave in
    `_given` (an Algorithm 2 option among them picks Algorithm 2: `choose`). Its signature
    stays `init`'s (`functools.wraps`: the registry's option check reads it)."""
    names = list(inspect.signature(init).parameters)[1:]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._given = frozenset(names[:len(args)]) | frozenset(kwargs)
        init(self, *args, **kwargs)
    return __init__


def normalized(inner: Any) -> Any:
    """`inner` as ProxAL keeps it: "auto", None (Algorithm 2; also "admm") or a solver object
    ("newton": a NewtonInner); anything else is refused."""
    if isinstance(inner, str) and inner in NAMES:
        return {"admm": None, "newton": NewtonInner()}.get(inner, inner)
    if inner is not None and not callable(getattr(inner, "solve_subproblem", None)):
        raise FedModelError(f"inner={inner!r} cannot solve ProxAL's subproblems; use inner='auto' (the "
                            "default: Newton steps where they fit, Algorithm 2 otherwise), 'newton', "
                            "'admm' (Algorithm 2; also None) or a solver such as backends.FedADMM(...)")
    return inner


def name_of(inner: Any) -> str:
    """The short name of an inner solver ("admm" for Algorithm 2, "newton", else its class)."""
    return "admm" if inner is None else "newton" if isinstance(inner, NewtonInner) else type(inner).__name__


def declared(executor: Any, flag: str) -> bool:
    """An executor's flag (`streams_sums`, `sum_only`) read before the run, from an instance, a
    class or a registered name (None: the default executor, serial or batched); a class's
    property — FlowerExecutor's `sum_only`, set per instance — reads as its default, False."""
    if isinstance(executor, str) or executor is None:
        executor = registry.lookup("executor", executor or "serial")
    value = getattr(executor, flag, False)
    return False if isinstance(value, property) else bool(value)


def streams_sums(executor: Any) -> bool:
    """`Executor.streams_sums` of `executor` (`declared`)."""
    return declared(executor, "streams_sums")


def newton_reading(problem, executor: Any = None) -> tuple[bool, str]:
    """(whether Newton steps fit this model on `executor`, why): module docstring."""
    private = [f"{c.name} ({why})" for c in problem.clients if (why := block_refusal(c))]
    if private:
        return False, f"private variables on clients {few(private)}"
    kinked = [f"client {c.name!r}" for c in problem.clients
              if any(t.kind != "norm1" or t.kinked is not None or t.constraint is not None
                     for t in classify_objective(c.terms).prox)]
    if kinked:
        return False, f"a client's prox term other than λ‖w‖₁ ({few(kinked)})"
    if not problem.is_convex():
        return False, "the model is not convex (DCP)"
    d, n = sum(variable_sizes(problem)), len(problem.clients)
    held = matrices_held(n, streams_sums(executor))
    if not solvers.dense_fits(d, held):
        return False, (f"d = {d}, {n} clients: a step's {held} dense d × d matrices "
                       f"({held * d * d:.3g} floats) are beyond the dense Newton budget "
                       f"(fedmodel.runtime.solvers.DENSE_NEWTON_FLOATS = {solvers.DENSE_NEWTON_FLOATS:.3g})")
    if declared(executor, "sum_only"):       # SecAgg+: entries within ±8, quantized
        return False, "secure aggregation (its sums bound and quantize each entry; not measured with Hessians)"
    return True, f"d = {d}, {n} clients: a step's {held} dense d × d matrices fit the dense budget"


def choose(backend, problem, executor: Any = None) -> tuple[Any, str]:
    """(the inner solver `backend` runs on `problem`: a solver object or None for Algorithm 2,
    why) — `backend.inner` itself unless it is "auto"."""
    if backend.inner is None:
        return None, "inner='admm' (or None) given: Algorithm 2 (consensus ADMM)"
    if backend.inner != "auto":
        return backend.inner, f"inner={backend.inner!r} given"
    asked = sorted(set(getattr(backend, "_given", ())) & set(ADMM_OPTIONS))
    if asked:
        return None, f"Algorithm 2's own options given ({', '.join(asked)}): Algorithm 2 (consensus ADMM)"
    fits, why = newton_reading(problem, executor)
    if fits:
        return NewtonInner(), f"{why}: federated Newton steps"
    return None, f"no Newton steps: {why}: Algorithm 2 (consensus ADMM)"


def run(backend, problem, topology: Any, executor: Any, options: dict) -> Outcome:
    """`Backend.run` of `backend` with the inner solver `choose` picks, and the default's
    fall-backs (module docstring); the choice in `outcome.info["inner"]`."""
    inner, why = choose(backend, problem, executor)
    inner = for_slacks(inner, problem)
    try:
        outcome = Backend.run(backend.with_inner(inner), problem, topology, executor, **options)
    except FedModelError as error:
        again = _fallback(backend, inner, error)
        if again is None:
            raise
        inner, why = again
        outcome = Backend.run(backend.with_inner(inner), problem, topology, executor, **options)
    outcome.info["inner"] = {"name": name_of(inner), "reason": why}
    return outcome


def for_slacks(inner: Any, problem) -> Any:
    """`inner`, or where it is a NewtonInner and clients eliminate epigraph slacks
    (`proxal_newton_slacks`), a copy with their β growth and cap (`SLACK_BETAS`): ProxAL takes
    them where its caller gave none (`ProxAL.with_inner`)."""
    if not isinstance(inner, NewtonInner) or not any(c.private_variables for c in problem.clients):
        return inner
    out = copy.copy(inner)
    out.beta_growth, out.beta_max = SLACK_BETAS
    return out


def _fallback(backend, inner: Any, error: FedModelError) -> tuple[Any, str] | None:
    """(the inner solver to run instead, why) after `error` ended a default run's first try
    before any step (None: raise it)."""
    if backend.inner != "auto":
        return None
    if isinstance(error, InnerMismatch):
        return normalized(error.saved), f"the checkpoint resumed was written with inner={error.saved!r}"
    if inner is not None and str(error).startswith(REFUSED):
        refusal = str(error).split(": ", 1)[-1].split("; use")[0]
        return None, f"Newton steps refused ({refusal}): Algorithm 2 (consensus ADMM)"
    return None


def few(items: list[str], shown: int = 3) -> str:
    """At most `shown` items, then how many more (a reason stays one line)."""
    more = f", … {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
