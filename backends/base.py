"""The `Backend` template every algorithm follows (Flower-style: `solve` drives overridable steps)."""
from __future__ import annotations

import copy
import functools
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedmodel import registry
from fedmodel.collector import collection_paused
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.feasibility import sets_apart
from fedmodel.compiler.scaling import equilibrate
from fedmodel.errors import DataError, FedModelError
from fedmodel.expression import Constant, Data, Parameter, is_sparse
from fedmodel.never_met import never_met
from fedmodel.result import Result
from fedmodel.runtime.auto_executor import DefaultExecutor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.executor import open_executor
from fedmodel.runtime.ledger import Ledger
from fedmodel.runtime.own_constraints import own_feasibility
from fedmodel.runtime import blas, solve_cache
from fedmodel.runtime.program import compile_programs
from .common import FRAMEWORK, gather_values, running
from .outcome import Outcome, Status
from .verdicts import (CONVERGED_VIOLATION, NOT_STATIONARY, _judge_steady_descent,
                       _not_converged_at_a_saddle, _not_converged_off_the_domain, _rounds, _say,
                       _warn_not_stationary, infeasible_alone, infeasible_before_run,
                       not_infeasible_when_sets_meet, restate_violated)


@dataclass
class Run:
    """What one run's algorithm loop is given besides the open executor (`Backend.loop`): the
    topology as `Backend.prepare` returned it, the user's callback, the progress flag and the
    checkpointer (the loop restores from it once its nodes are initialized:
    `Checkpointer.restore` must come after the requests that initialize the nodes' state)."""

    topology: Any = None
    callback: Callable[[dict], Any] | None = None
    verbose: bool = False
    checkpointer: Checkpointer = NO_CHECKPOINT


class Backend:
    """Base class: the run the framework owns. `solve` equilibrates, checkpoints and judges
    the outcome (`finish_result`); `run` checks (`prepare`), compiles (`compile`), opens the
    executor as a context — closed, its node programs handed back and its actors or threads
    ended, however the run ends (an error, KeyboardInterrupt) — with the backend's node
    `procedures` registered, calls the algorithm `loop` on it, gathers the values at the
    loop's shared vector and returns an `Outcome`. A subclass implements `loop` and lists its
    node steps in `procedures`."""

    name = "backend"
    checkpointing = False   # True: its loop saves and restores checkpoints (docs/checkpoints.md)
    convergence_needs_convexity = True   # its guarantees assume a convex model (warn otherwise)
    # solve the equilibrated model (fedmodel/compiler/scaling.py) and report in the user's
    # units; False: the model as written (paper presets, whose constants are in the paper's units)
    scaling = True
    # the node procedures its loop sends (`@procedure` functions or `messages.Procedure`s),
    # registered when the run opens its executor, with the framework's own (gathering values)
    procedures: tuple = ()
    framework_procedures: tuple = FRAMEWORK + (own_feasibility,)
    # True in a paper's preset: its stop test at the paper's tolerances defines "converged" (an
    # ε-KKT point, paper 1's Definition 1), so a loose point there is warned about, not "stalled".
    paper_stop: bool = False
    # intersect the nodes' data-free sets before the run (compiler/feasibility.py): sets with no
    # common point end as "infeasible" at once (False: CVXPY, which decides feasibility itself)
    checks_sets_meet = True
    # each client checks alone whether its own constraints that read its data have a common
    # point, before the loop (`own_constraints_meet`): one round trip (False: CVXPY)
    checks_clients_alone = True
    # hinge / pinball / |r| client losses: True if its runs take the epigraph form of
    # `compiler.epigraph` (a client's private slacks and inequalities, exactly); False: refused
    # before the run
    solves_epigraph: bool = False
    # the column scales D of the shared entries when the run solves the equilibrated copy (set
    # on the runner by `solve`): a distance test reads them to hold in the user's units
    user_scales: np.ndarray | None = None

    def equilibrates(self) -> bool:
        """Whether this run solves the equilibrated model (`scaling`; a private run overrides
        it: a data-dependent scaling is a release its accountant does not cover)."""
        return bool(self.scaling)

    def solve(self, problem, topology=None, executor=None, callback=None, verbose=False,
              checkpoint=None, checkpoint_every=None, resume=False, scaling=None, **unknown) -> Result:
        """Run the algorithm on `problem` (`Problem.solve` calls this). `scaling`: solve the
        equilibrated model (True), the model as written (False), or the backend's default
        (None: `self.scaling`, off in the papers' presets). Another keyword is refused."""
        refuse_unknown(self.name, unknown, SOLVE_OPTIONS)
        if self.convergence_needs_convexity and not problem.is_convex():
            warnings.warn(f"{self.name}: the model is not convex (DCP rules), so the algorithm's "
                          "convergence guarantees do not apply and CVXPY cannot certify the "
                          "result; the KKT certificate on the Result still does", stacklevel=3)
        check_scaling(problem)
        start = time.perf_counter()
        apart = sets_apart(problem) if self.checks_sets_meet else None
        never = never_met(problem) if self.checks_sets_meet and apart is None else None
        if apart is not None or never is not None:      # (an algorithm would run to its cap)
            return finish_result(problem, self.name, infeasible_before_run(apart, never),
                                 time.perf_counter() - start)
        with solve_cache.solving(problem) as kept:    # a warm re-solve reuses (`solve_cache`)
            with collection_paused():
                wanted = self.equilibrates() if scaling is None else bool(scaling) and self.equilibrates()
                model = solve_cache.equilibrated(kept, problem, equilibrate) if wanted else None
            work, runner = problem, self
            if model is not None:      # the run sees the equilibrated copy, in its units
                work, runner = model.problem, copy.copy(self)
                runner.user_scales = model.shared_scales()
                for option in ("w0", "x0"):     # a start point (ProxAL's w0, DALD's x0) in its units
                    if getattr(self, option, None) is not None:
                        setattr(runner, option, model.shared_to_scaled(getattr(self, option)))
                if callback is not None:
                    callback = functools.partial(_in_user_units, callback, model)
            checkpointer = Checkpointer.create(self, work, checkpoint, checkpoint_every, resume)
            try:
                finished = checkpointer.finished()       # resuming a run that had already finished
                if finished is not None:
                    outcome = Outcome.of(finished)
                else:
                    outcome = Outcome.of(runner.run(work, topology=topology, executor=executor,
                                                    callback=callback, verbose=verbose,
                                                    checkpointer=checkpointer))
                    checkpointer.finish(outcome.as_dict())
            finally:
                solve_cache.release(kept, model)
        if model is not None:
            outcome = Outcome.of(model.outcome_to_user(outcome.as_dict()))
        wall_time = time.perf_counter() - start
        return finish_result(problem, self.name, outcome, wall_time, paper_stop=self.paper_stop)

    def run(self, problem, topology=None, executor=None, callback=None, verbose=False,
            checkpoint=None, checkpoint_every=None, resume=False,
            checkpointer: Checkpointer | None = None, **unknown) -> Outcome:
        """One run on `problem` as given (no equilibration, no verdicts: `solve` adds those),
        owned by the framework (class docstring). `checkpointer`: made from `checkpoint`,
        `checkpoint_every`, `resume` when not given. Another keyword is refused."""
        refuse_unknown(self.name, unknown, RUN_OPTIONS)
        if checkpointer is None:
            checkpointer = Checkpointer.create(self, problem, checkpoint, checkpoint_every, resume)
        run = Run(self.prepare(problem, topology), callback, verbose, checkpointer)
        programs = self.compile(problem)
        served = tuple(self.framework_procedures) + tuple(self.procedures)
        with blas.run_blas_threads(), open_executor(self.executor_for(executor), programs, served) as ex, \
                running(ex):
            alone, pooled = ({}, False) if not self.checks_own_constraints() else \
                own_constraints_meet(problem, ex)
            if alone:
                outcome = infeasible_alone(alone, pooled)
                outcome.ledger = ex.ledger
                return outcome
            outcome = self.loop(problem, ex, run)
            if outcome.values is None:           # gathered at the loop's shared vector
                values, multipliers = gather_values(ex, problem, outcome.shared)
                outcome.values, outcome.multipliers = values, {**multipliers, **outcome.multipliers}
            self.conclude(problem, ex, run, outcome)
            outcome.ledger = ex.ledger
            if getattr(ex, "auto_choice", None):      # executor None or "auto": what it picked, why
                outcome.info["executor"] = dict(zip(("name", "reason"), ex.auto_choice))
        return outcome

    def checks_own_constraints(self) -> bool:
        """Whether the run asks the clients to check their own constraints
        (`checks_clients_alone`), never in a private run: the replies depend on the data, a
        release its accountant does not cover (`equilibrates` is False for such a run whatever
        `scaling` is, for the same reason)."""
        if not self.checks_clients_alone:
            return False
        probe = copy.copy(self)
        probe.scaling = True
        return probe.equilibrates()

    # ---- the steps a backend overrides --------------------------------------------------------
    def prepare(self, problem, topology) -> Any:
        """Check the model and the topology before anything is opened (raise FedModelError);
        return the topology the loop gets as `run.topology`."""
        return topology

    def compile(self, problem) -> dict:
        """The run's node programs (default: one per block, `compile_programs`)."""
        return compile_programs(problem)

    def executor_for(self, executor: Any) -> Any:
        """The executor this backend runs on, given the user's choice (default: that one; none
        named: `DefaultExecutor`, serial or batched by the clients, serial's numbers)."""
        return DefaultExecutor() if executor is None else executor

    def loop(self, problem, ex, run: Run) -> Outcome:
        """The algorithm on the open executor `ex`: an `Outcome` whose `values` are None (the
        framework gathers them at `shared`, the final flat shared vector) or set."""
        raise NotImplementedError

    def conclude(self, problem, ex, run: Run, outcome: Outcome) -> None:
        """After the values are gathered, with the executor still open: what the backend adds
        to `outcome` from its nodes (e.g. the multipliers of projected sets)."""


SOLVE_OPTIONS = ("topology", "executor", "callback", "verbose", "checkpoint", "checkpoint_every",
                 "resume", "scaling")
RUN_OPTIONS = ("topology", "executor", "callback", "verbose", "checkpoint", "checkpoint_every",
               "resume", "checkpointer")


def refuse_unknown(name: str, unknown: dict[str, Any], valid: tuple[str, ...]) -> None:
    """A FedModelError naming the first keyword of `unknown` (with the closest valid one) —
    the boundary where a misspelt run option used to be swallowed by `run(**_)`."""
    if unknown:
        given = sorted(unknown)[0]
        message = registry.unknown_option(name, given, list(valid))
        raise FedModelError(message.replace("for backend", "of a run of backend") +
                            " (a backend's own options go to its constructor)")


def own_constraints_meet(problem, ex) -> tuple[dict[str, tuple[str, float]], bool]:
    """({client: (constraint, relative least violation)} of the clients whose own constraints
    have no common point, each deciding on its data (`runtime.own_constraints`); whether the
    run pools every block in one node). One round trip to the clients with a constraint that
    reads data (none: none sent). A run whose clients are no nodes (cProx-AL pools every block
    in "server") asks that node, whose constraints are the whole model's (no round trip)."""
    reading = [block.name for block in problem.clients
               if any(c.expr.data_owners() for c in block.constraints)]
    asked = {name: {} for name in reading if name in ex.nodes}
    if not asked and reading and not any(block.name in ex.nodes for block in problem.clients):
        asked = {"server": {}}
    if not asked:
        return {}, False
    owners = {c.name: c.owner for c in problem.constraints}
    replies = ex.map("own_feasibility", asked)
    return {owners.get(reply["constraint"], node): (reply["constraint"], float(reply["violation"]))
            for node, reply in replies.items() if reply["violation"] > 0}, "server" in asked


def _in_user_units(callback, model, record: dict) -> Any:
    return callback(model.record_to_user(record))


def paper_preset(backend: "Backend") -> "Backend":
    """A paper's exact setting solves the model as written: its constants (ρ, β, steps,
    tolerances) are in the paper's units, not in the equilibrated ones."""
    backend.scaling = False
    backend.paper_stop = True
    return backend


# Data whose entries exceed HUGE are refused: products of a few such entries (a squared loss of
# X w, its gradient Xᵀ(X w − b), a Hessian XᵀX) overflow double precision (1e308). Above LARGE:
# a warning. Data whose largest entry is below TINY (and not 0) are refused too: their squares
# underflow (1e-308) and every backend, CVXPY too, would return w = 0 as the answer.
HUGE, LARGE, TINY = 1e100, 1e20, 1e-100


def check_scaling(problem) -> None:
    """One pass over every block's data, constants and parameter values before a run: non-finite
    entries (e.g. data changed in place after `client.data`) or entries above HUGE raise
    DataError, entries above LARGE warn — naming the block and the item, with a hint to rescale —
    instead of a run that overflows, never ends or returns a meaningless answer."""
    seen: set[int] = set()
    for block in problem.blocks:
        leaves = list(block.data_items)
        for expr in block.terms + [c.expr for c in block.constraints]:
            leaves += [leaf for leaf in expr.leaves() if isinstance(leaf, (Constant, Parameter))]
        for leaf in leaves:
            if id(leaf) in seen or getattr(leaf, "remote", False) or leaf.value is None:
                continue
            seen.add(id(leaf))
            value = leaf.value.data if is_sparse(leaf.value) else leaf.value   # stored entries
            array = np.asarray(value, dtype=float)
            if array.size == 0:
                continue
            largest = max(float(np.max(array)), -float(np.min(array)))   # no |array| copy
            what = f"{type(leaf).__name__.lower()} {getattr(leaf, 'label', leaf.name)!r} of block {block.name!r}"
            if not np.isfinite(largest):
                raise DataError(f"{what} has non-finite entries (NaN or inf); remove or impute them "
                                "before solving")
            if largest > HUGE:
                raise DataError(f"{what} has entries as large as {largest:.3g}: squared losses and "
                                "gradients overflow in double precision. Rescale it (e.g. divide by "
                                "its largest entry or standardize its columns) and solve again")
            if 0 < largest < TINY and isinstance(leaf, Data):
                raise DataError(f"{what} has no entry larger than {largest:.3g}: squared losses and "
                                "gradients underflow in double precision. Rescale it (e.g. divide "
                                "by its largest entry) and solve again")
            if largest > LARGE:
                warnings.warn(f"{what} has entries as large as {largest:.3g}: badly scaled data make "
                              "the backends' absolute tolerances meaningless and may overflow; "
                              "consider rescaling it", RuntimeWarning, stacklevel=4)


def _evaluate(problem, values: dict[int, np.ndarray]) -> tuple[float, list[float]] | None:
    """Total objective and each constraint's violation at `values` (None: a value is missing)."""
    variables = problem.variables()
    if any(v.uid not in values for v in variables):
        return None
    outputs = [problem.objective] + [c.expr for c in problem.constraints]
    evaluated = Plan(outputs, variables)(*[values[v.uid] for v in variables])
    return float(evaluated[0]), [c.violation(val) for c, val in zip(problem.constraints, evaluated[1:])]


def objective_and_violation(problem, values: dict[int, np.ndarray]) -> tuple[float, float]:
    """Total objective and the largest constraint violation (global and local) at `values`."""
    evaluated = _evaluate(problem, values)
    if evaluated is None:
        return float("nan"), float("nan")
    return evaluated[0], max([0.0] + evaluated[1])


def violated_constraints(problem, values: dict[int, np.ndarray], tol: float = 0.0) -> dict[str, float]:
    """{"name: rendered constraint": violation} of the constraints violated by more than `tol`
    at `values`, largest first (an infeasible or stalled run names them; ProxAL's nodes report
    theirs in the same form)."""
    evaluated = _evaluate(problem, values)
    if evaluated is None:
        return {}
    pairs = [(repr(c), v) for c, v in zip(problem.constraints, evaluated[1]) if v > tol]
    return dict(sorted(pairs, key=lambda pair: -pair[1]))


def finish_result(problem, backend_name: str, outcome: Outcome | dict[str, Any], wall_time: float,
                  paper_stop: bool = False) -> Result:
    """The public `Result` of a run's `outcome` on `problem`: objective, violation and KKT
    certificate evaluated on the model, and the framework's verdicts on the backend's status
    (a "converged" point that violates constraints or is far from stationary is "stalled" — the
    latter only warned about under a paper's stop test, `paper_stop` — and a round cap reached
    while the objective kept falling is "unbounded")."""
    outcome = Outcome.of(outcome)
    values = outcome.values or {}
    certificate = outcome.certificate
    if problem.remote_data():
        # The data lives on the workers (loaders): the driver cannot evaluate the model, so the
        # objective and violation are the nodes' own last report and there is no KKT certificate
        # here (docs/ray.md); prob.load_data() then fm.verify(result) gives both.
        last = outcome.history or [{}]
        objective = float(last[-1].get("objective", float("nan")))
        violation = float(last[-1].get("violation", float("nan")))
    else:
        with collection_paused():    # whole-model plans: millions of objects at n = 10⁴
            objective, violation = objective_and_violation(problem, values)
            if certificate is None and values and np.isfinite(objective):
                certificate = problem.kkt_certificate(values, outcome.multipliers)
            relative = certificate is not None and certificate.relative
            if outcome.status is Status.CONVERGED and values and not np.isfinite(objective):
                _not_converged_off_the_domain(backend_name, outcome, objective)
            if _violates(violation, certificate if relative else None) and (
                    outcome.status is Status.CONVERGED or (
                        outcome.status is Status.MAX_ITERATIONS and outcome.biased_fixed_point)):
                _not_converged_when_infeasible(problem, backend_name, outcome, values)
            if outcome.info.get("violated") and values:     # each in its own units
                restate_violated(outcome.info, violated_constraints(problem, values, -np.inf))
        if outcome.status is Status.CONVERGED and certificate is not None:
            stationarity = certificate.relative_stationarity if relative else certificate.stationarity
            if stationarity > NOT_STATIONARY:
                _warn_not_stationary(backend_name, outcome, stationarity, paper_stop, problem)
            elif relative and not problem.is_convex():     # a KKT point of a nonconvex model
                _not_converged_at_a_saddle(problem, backend_name, outcome, values, certificate, paper_stop)
    not_infeasible_when_sets_meet(problem, backend_name, outcome)
    if outcome.status is Status.MAX_ITERATIONS:
        _judge_steady_descent(outcome)
    if outcome.ledger is not None:      # round trips, floats and bytes per client (the ledger's)
        outcome.info["communication"] = outcome.ledger.summary([c.name for c in problem.clients])
    else:       # no message sent (a centralized solve, a verdict before the run): `res.ledger`
        outcome.ledger = Ledger()      # reads 0 round trips (newuser13), no communication line
    result = Result(status=outcome.status, values=values, objective=objective,
                    max_violation=violation, backend=backend_name,
                    iterations=outcome.iterations, multipliers=outcome.multipliers,
                    ledger=outcome.ledger, certificate=certificate, wall_time=wall_time,
                    info=outcome.info, problem=problem)
    result.history.extend(outcome.history)
    return result


def _violates(violation: float, certificate) -> bool:
    """Whether a point's largest violation makes it no answer: above CONVERGED_VIOLATION both
    absolutely and relative to its constraint's terms, read from `certificate` (one with the
    relative measures, else None): a budget in the data's units ×1e3 reads 13.8 at a point
    1.2e-7 off in relative terms, an answer as in ×1."""
    return violation > CONVERGED_VIOLATION and not (
        certificate is not None and certificate.relative_feasibility <= CONVERGED_VIOLATION)


def _not_converged_when_infeasible(problem, backend_name: str, outcome: Outcome, values) -> None:
    """A run that stopped moving at a point violating constraints by more than
    CONVERGED_VIOLATION (FedAvg / FedProx on contradictory client sets: their stop test is the
    model's change only) is "stalled", naming the constraints, never "converged". So is a run
    at its round cap whose outcome says `biased_fixed_point` (FedAvg / FedProx / DGD: each
    client's constraints hold at its own iterate, not at their average, so more rounds do not
    remove the violation): "max_iterations" would suggest they might."""
    violated = violated_constraints(problem, values, CONVERGED_VIOLATION)
    worst = ", ".join(f"{name} by {v:.3g}" for name, v in list(violated.items())[:3])
    outcome.info["violated"] = violated
    how = "stopped moving" if outcome.status is Status.CONVERGED else \
        f"reached its round cap ({_rounds(outcome)}) without removing the violation,"
    _say(outcome, "stalled", f"{backend_name} {how} at a point that violates {worst}: not a "
         "solution. The model may be infeasible (prob.solve('cvxpy') decides it), or this backend "
         "does not enforce these constraints at its fixed point (ProxAL and DALD do)", status=Status.STALLED)
