"""`Problem`: a federated model over its blocks (`blocks.py`: the server and the clients), its
checks, its centralized forms and `solve`."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from . import registry
from .atoms import add
from .blocks import Block, Client, Server, flatten_constraints
from .certificate import kkt_certificate
from .collector import solve_scope
from .compiler.epigraph import rewrite_for
from .compiler.split import split_constraint, split_objective
from .compiler.start import remember_solved, start_solver
from .constraints import Constraint
from .errors import DataError, FedModelError
from .expression import Data, Expression, Parameter, Variable, as_expr
from .result import Certificate

_problem_ids = itertools.count()


def _check_names(problem: "Problem", variables: list[Variable]) -> None:
    """Shared variables need problem-wide unique names; a private variable's name is scoped to
    its client (unique there, checked by `Client.variable`, and not the name of a shared
    variable the client could also use)."""
    shared: dict[str, Variable] = {}
    for var in variables:
        if var.owner is None:
            if var.name in shared:
                raise FedModelError(
                    f"two different shared variables are named {var.name!r} in problem "
                    f"{problem.name!r} (used in {problem._users_of(shared[var.name])} and "
                    f"{problem._users_of(var)}); shared variables need problem-wide unique names "
                    "(client.variable makes a private one, named within its client)")
            shared[var.name] = var
    for var in variables:     # (Client.variable keeps a client's own names distinct)
        if var.owner is None:
            continue
        if var.name in shared:
            raise FedModelError(
                f"variable {var.label!r} private to client {var.owner!r} has the name of the shared "
                f"variable {var.name!r}: inside client {var.owner!r} the name would be ambiguous; "
                "rename one of them")
        if var.label in shared:   # a shared variable literally named "c0.s"
            raise FedModelError(f"the shared variable {var.label!r} would be shown like the private "
                                f"variable {var.name!r} of client {var.owner!r}; rename the shared one")


class Problem:
    """A federated model: `Σ_blocks objective` subject to every block's constraints.

    >>> import fedmodel as fm, numpy as np
    >>> w = fm.Variable(2, name="w")
    >>> prob = fm.Problem()
    >>> c = prob.add_client("c0")
    >>> c.minimize(fm.sum_squares(w - c.data(np.array([1.0, 2.0]), name="z")))
    >>> round(prob.solve("cvxpy").objective, 6)
    0.0
    """

    def __init__(self, name: str | None = None):
        self.uid = next(_problem_ids)
        self.name = name or f"problem{self.uid}"
        self.clients: list[Client] = []
        self.server = Server(self, "server")
        self.slacks: list[Variable] = []
        self._constraint_names: dict[str, str] = {}   # name -> owning block
        self._counters: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"Problem({self.name!r}, clients={len(self.clients)})"

    def __getstate__(self) -> dict:
        """A pickled or copied Problem leaves its last solve's kept programs behind
        (`runtime.solve_cache`: they hold closures and are keyed by the originals' ids)."""
        state = dict(self.__dict__)
        state.pop("_solve_cache", None)
        return state

    # ---- blocks ---------------------------------------------------------------------------
    def add_client(self, name: str | None = None, weight: float | None = None) -> Client:
        name = name if name is not None else f"c{len(self.clients)}"
        if not isinstance(name, str) or not name:
            raise FedModelError(f"client name {name!r} must be a non-empty string")
        taken = self._client_names()
        if name == "server" or name in taken:
            raise FedModelError(f"a block named {name!r} already exists in problem "
                                f"{self.name!r}; client names must be unique and not 'server'")
        client = Client(self, name, weight)
        self.clients.append(client)
        taken.add(name)
        return client

    def _client_names(self) -> set[str]:
        """The clients' names as a set, kept beside `clients` (rebuilt when the list changed size
        behind its back): a name check per `add_client` that is O(1), not O(n) — O(n²) for a
        model of 10⁵ clients."""
        names = getattr(self, "_names", None)
        if names is None or len(names) != len(self.clients):
            names = self._names = {c.name for c in self.clients}
        return names

    def block(self, name: str) -> Block:
        if name == "server":
            return self.server
        for client in self.clients:
            if client.name == name:
                return client
        raise FedModelError(f"problem {self.name!r} has no block named {name!r}")

    @property
    def blocks(self) -> list[Block]:
        return [self.server, *self.clients]

    # ---- centralized writing, split by the compiler ----------------------------------------
    def minimize(self, expr: Any) -> None:
        """Add an objective written as if centralized; terms go to the blocks owning their data."""
        expr = as_expr(expr)
        for leaf in expr.leaves():
            if getattr(leaf, "problem_id", self.uid) != self.uid:
                raise FedModelError(f"objective uses {leaf.name!r}, which belongs to another Problem")
        split_objective(self, expr)

    def subject_to(self, *constraints: Constraint) -> None:
        """Add constraints written as if centralized; data-coupled ones are decoupled with slacks."""
        for constraint in flatten_constraints(constraints):
            if not isinstance(constraint, Constraint):
                raise FedModelError(f"subject_to takes constraints such as `expr <= 0`, got {constraint!r}")
            split_constraint(self, constraint)

    # ---- bookkeeping ----------------------------------------------------------------------
    def fresh_constraint_name(self, owner: str) -> str:
        """An unused name for an unnamed constraint of block `owner`: `<owner>.con<k>`."""
        while True:
            k = self._counters.get(owner, 0)
            self._counters[owner] = k + 1
            name = f"{owner}.con{k}"
            if name not in self._constraint_names:
                return name

    def check_constraint_name(self, name: str, owner: str) -> None:
        """Raise when `name` is taken (constraint names are unique across the whole problem)."""
        if not isinstance(name, str) or not name:
            raise FedModelError(f"constraint name {name!r} (block {owner!r}) must be a non-empty "
                                "string")
        if name in self._constraint_names:
            raise FedModelError(
                f"constraint name {name!r} is used twice in problem {self.name!r}: block "
                f"{self._constraint_names[name]!r} already has a constraint of that name (adding "
                f"it to block {owner!r}); constraint names are unique across the problem")

    def claim_constraint_name(self, name: str, owner: str = "?") -> None:
        """Record `name` as taken by block `owner` (after `check_constraint_name`'s checks)."""
        self.check_constraint_name(name, owner)
        self._constraint_names[name] = owner

    def add_slack(self, slack: Variable) -> None:
        """Adopt a slack variable the owner split (`compiler.split`) introduced."""
        slack.problem_id = self.uid
        self.slacks.append(slack)

    # ---- whole-model views ----------------------------------------------------------------
    @property
    def objective(self) -> Expression:
        return add(*[b.objective for b in self.blocks])

    @property
    def objective_terms(self) -> list[Expression]:
        """Every block's objective terms, server first (their sum is `objective`)."""
        return [t for b in self.blocks for t in b.terms]

    @property
    def constraints(self) -> list[Constraint]:
        return [c for b in self.blocks for c in b.constraints]

    def variables(self) -> list[Variable]:
        """All variables, shared first (in order of appearance), then private ones."""
        seen: dict[int, Variable] = {}
        exprs = self.objective_terms + [c.expr for c in self.constraints]
        for expr in exprs:
            for var in expr.variables():
                seen.setdefault(var.uid, var)
        for slack in self.slacks:
            seen.setdefault(slack.uid, slack)
        variables = list(seen.values())
        _check_names(self, variables)
        return [v for v in variables if v.owner is None] + [v for v in variables if v.owner is not None]

    def _users_of(self, var: Variable) -> str:
        users = [b.name for b in self.blocks
                 if any(var.uid == v.uid for e in b.terms + [c.expr for c in b.constraints]
                        for v in e.variables())]
        return "block " + ", ".join(map(repr, users)) if users else "slacks"

    def variable_by_label(self, label: str) -> Variable:
        """The variable shown as `label`: `"w"` for a shared one, `"c3.s"` for a private one."""
        for var in self.variables():
            if var.label == label:
                return var
        raise FedModelError(f"problem {self.name!r} has no variable {label!r}; its variables are "
                            f"{[v.label for v in self.variables()]}")

    def parameters(self) -> list[Parameter]:
        """The Parameters the model reads (every block's terms and constraints), each once."""
        seen: dict[int, Parameter] = {}
        for expr in self.objective_terms + [c.expr for c in self.constraints]:
            for param in expr.parameters():
                seen.setdefault(param.uid, param)
        return list(seen.values())

    def parameter_values(self) -> dict[int, np.ndarray]:
        """{uid: a copy of the value} of the model's Parameters now (`Result.parameters`)."""
        return {p.uid: None if p.value is None else np.array(p.value, copy=True)
                for p in self.parameters()}

    def shared_variables(self) -> list[Variable]:
        return [v for v in self.variables() if v.owner is None]

    def validate(self) -> None:
        """Raise a clear error for an empty model or an empty client."""
        if not self.clients and not self.server.terms and not self.server.constraints:
            raise FedModelError(f"problem {self.name!r} is empty: add clients with add_client()")
        for client in self.clients:
            if not client.terms and not client.constraints:
                raise DataError(f"client {client.name!r} has no objective term and no constraint; "
                                "give it a term (client.minimize) or remove it")
        if not self.variables():
            raise FedModelError(f"problem {self.name!r} has no variables")
        for block in self.blocks:
            exprs = block.terms + [c.expr for c in block.constraints]
            for expr in exprs:
                for param in expr.parameters():
                    if param.value is None:
                        raise FedModelError(
                            f"parameter {param.name!r} (used in {expr} of block {block.name!r}) "
                            f"has no value; set {param.name}.value before solving")

    def remote_data(self) -> list[Data]:
        """Data items produced on the workers by loaders and not loaded in this process."""
        return [d for b in self.blocks for d in b.data_items if d.remote]

    def load_data(self) -> "Problem":
        """Run every loader in this process (to verify or lower to CVXPY a model whose data is
        produced on the workers — only where this process may hold the data)."""
        for item in self.remote_data():
            item.load()
        return self

    def is_convex(self) -> bool:
        return self.objective.is_convex() and all(c.is_dcp() for c in self.constraints)

    def kkt_certificate(self, values: dict[int, np.ndarray],
                        multipliers: dict[str, np.ndarray]) -> Certificate:
        """The KKT residuals of this model at `values` with `multipliers` (`fedmodel.certificate`)."""
        return kkt_certificate(self.variables(), self.objective_terms, self.constraints, values,
                               multipliers)

    # ---- solving --------------------------------------------------------------------------
    def to_cvxpy(self):
        """The centralized `cvxpy.Problem` of this model (same objective, all constraints)."""
        from .lowering.problem import lower_problem
        return lower_problem(self)[0]

    def solve(self, backend: Any = None, topology: Any = None, executor: Any = None,
              callback: Any = None, verbose: bool = False, checkpoint: str | None = None,
              checkpoint_every: int | None = None, resume: bool = False,
              scaling: bool | None = None, **options: Any):
        """Solve with a backend (instance or name; "auto" — also None, the default, as CVXPY's
        `solver=None` — picks one for the model and the executor and says why in
        `res.info["auto"]`); see docs/api.md §2 for the arguments.
        `scaling=False` solves the model as written instead of its equilibrated copy
        (`fedmodel.compiler.scaling`; None: the backend's default)."""
        self.validate()
        solver = make_backend(backend, **options)
        solver = start_solver(self, solver, backend)     # from w.value when the user set it
        extra = {} if scaling is None else {"scaling": scaling}   # any backend with `solve`
        # hinge / pinball / |r| client losses: solved in epigraph form (`compiler.epigraph`)
        epigraph = rewrite_for(self, solver)
        solved_at = self.parameter_values()     # `fm.verify` checks the result at these
        with solve_scope():      # the node programs are frozen for the run (`freeze_setup`)
            result = solver.solve(epigraph.problem if epigraph else self, topology=topology,
                                  executor=executor, callback=callback, verbose=verbose,
                                  checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                                  resume=resume, **extra)
        if epigraph is not None:
            result = epigraph.to_user(result)
        result.parameters = solved_at
        for var in self.variables():   # as in CVXPY: values of the last solve, None if it failed
            var.value = result.values.get(var.uid)
        remember_solved(self.variables())     # not a start the user asked for (`compiler.start`)
        return result


def make_backend(backend: Any, **options: Any) -> Any:
    """The backend `Problem.solve` runs: an instance (anything with a `solve(problem, ...)`
    method) as it is, or the class registered under a name (`fedmodel.registry`, filled from the
    entry points in pyproject.toml) built with `options`. The problem layer never imports the
    backends above it: it only knows their names and that they have `solve`."""
    if backend is None:
        backend = "auto"
    is_instance = not isinstance(backend, (str, type)) and callable(getattr(backend, "solve", None))
    if not is_instance:
        return registry.lookup("backend", backend)(**options)
    if options:
        raise FedModelError(f"options {sorted(options)} are for a backend given by name; "
                            "pass them to the backend's constructor instead")
    return backend


def render(obj) -> str:
    """Readable text of a Problem (every block's objective, constraints and variables, private
    ones as `client.name`), an expression or a constraint (`fm.render`)."""
    if isinstance(obj, Expression):
        return obj.render()
    if isinstance(obj, Constraint):
        return repr(obj)
    if not isinstance(obj, Problem):
        raise FedModelError(f"fm.render takes a Problem, an expression or a constraint, got "
                            f"{type(obj).__name__}")
    lines = [f"problem {obj.name!r}: minimize the sum of the blocks' objectives"]
    for var in obj.variables():
        where = "shared" if var.owner is None else f"private to client {var.owner!r}"
        lines.append(f"  variable {var.label}  shape {var.shape}  ({where})")
    for block in obj.blocks:
        if not (block.terms or block.constraints or block.data_items):
            continue
        data = ", ".join(f"{d.name} {d.shape}" for d in block.data_items)
        title = "server" if block.kind == "server" else f"client {block.name}"
        lines.append(title + (f"  (data: {data})" if data else ""))
        if block.terms:
            lines.append(f"  minimize   {' + '.join(t.render() for t in block.terms)}")
        lines.extend(f"  subject to {c!r}" for c in block.constraints)
    return "\n".join(lines)
