"""`Problem` and its blocks: the server (global constraints, regularizer) and the clients
(objective terms and local constraints over private data, private variables)."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .atoms import add
from .constraints import Constraint
from .errors import DataError, FedModelError
from .expression import Constant, Data, Expression, Variable, as_expr

_problem_ids = itertools.count()


class Block:
    """A node's share of the model: objective terms, constraints, data (and private variables)."""

    kind = "block"

    def __init__(self, problem: "Problem", name: str):
        self.problem = problem
        self.name = name
        self.terms: list[Expression] = []
        self.constraints: list[Constraint] = []
        self.data_items: list[Data] = []
        self.private_variables: list[Variable] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, terms={len(self.terms)}, constraints={len(self.constraints)})"

    # ---- declarations ---------------------------------------------------------------------
    def data(self, array: Any, name: str | None = None) -> Data:
        """A constant owned by this block: it never leaves the node that holds it."""
        name = name if name is not None else f"{self.name}_data{len(self.data_items)}"
        if any(d.name == name for d in self.data_items):
            raise FedModelError(f"block {self.name!r} already has data named {name!r}; "
                                "use a different name")
        if isinstance(array, Expression):
            raise DataError(f"data {name!r} of block {self.name!r} must be a numeric array, not "
                            "an expression")
        item = Data(array, owner=self.name, name=name)
        item.problem_id = self.problem.uid
        self.data_items.append(item)
        return item

    def minimize(self, expr: Any) -> None:
        """Add a term to this block's objective (call several times to add several)."""
        expr = as_expr(expr)
        if expr.shape != ():
            raise FedModelError(f"objective term of block {self.name!r} must be scalar; {expr} "
                                f"has shape {expr.shape} (wrap it in fm.sum or fm.mean)")
        self._check_access(expr, "objective term")
        self.terms.append(expr)

    def subject_to(self, *constraints: Constraint) -> None:
        """Add constraints (`a <= b`, `a >= b`, `a == b`) owned by this block."""
        for constraint in _flatten(constraints):
            if not isinstance(constraint, Constraint):
                raise FedModelError(f"subject_to on block {self.name!r} takes constraints such as "
                                    f"`expr <= 0`, got {constraint!r}")
            self._check_access(constraint.expr, f"constraint {constraint!r}")
            if constraint.name is None:
                constraint.name = self.problem.fresh_constraint_name(self.name)
            self.problem.claim_constraint_name(constraint.name)
            constraint.owner = self.name
            self.constraints.append(constraint)

    # ---- derived --------------------------------------------------------------------------
    @property
    def objective(self) -> Expression:
        return add(*self.terms) if self.terms else Constant(0.0)

    def _check_access(self, expr: Expression, what: str) -> None:
        for leaf in expr.leaves():
            problem_id = getattr(leaf, "problem_id", self.problem.uid)
            if problem_id != self.problem.uid:
                raise FedModelError(f"{what} of block {self.name!r} uses {leaf.name!r}, which "
                                    "belongs to another Problem; build each model from its own "
                                    "data and variables")
        foreign = sorted(o for o in expr.data_owners() if o != self.name)
        if foreign:
            raise FedModelError(
                f"{what} of block {self.name!r} reads data of {', '.join(map(repr, foreign))}: a "
                "block may only read its own data (and constants). Move the term to its owner, "
                "or write the model centrally with prob.minimize/prob.subject_to so the compiler "
                "splits it")
        for var in expr.variables():
            if var.owner is not None and var.owner != self.name:
                raise FedModelError(f"{what} of block {self.name!r} uses {var.name!r}, a variable "
                                    f"private to client {var.owner!r}")


def _flatten(items) -> list:
    out = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


class Client(Block):
    """A client: private data, objective terms, local constraints, private variables."""

    kind = "client"

    def __init__(self, problem: "Problem", name: str, weight: float | None = None):
        super().__init__(problem, name)
        self.weight = weight

    def variable(self, shape: int | tuple = (), name: str | None = None) -> Variable:
        """A variable private to this client (no consensus), e.g. a slack."""
        name = name if name is not None else f"{self.name}_var{len(self.private_variables)}"
        var = Variable(shape, name=name)
        var.owner = self.name
        var.problem_id = self.problem.uid
        self.private_variables.append(var)
        return var


class Server(Block):
    """The server: global constraints and the (possibly nonsmooth) regularizer h."""

    kind = "server"


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
        self._constraint_names: set[str] = set()
        self._counters: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"Problem({self.name!r}, clients={len(self.clients)})"

    # ---- blocks ---------------------------------------------------------------------------
    def add_client(self, name: str | None = None, weight: float | None = None) -> Client:
        name = name if name is not None else f"c{len(self.clients)}"
        if not isinstance(name, str) or not name:
            raise FedModelError(f"client name {name!r} must be a non-empty string")
        if name == "server" or any(c.name == name for c in self.clients):
            raise FedModelError(f"a block named {name!r} already exists in problem "
                                f"{self.name!r}; client names must be unique and not 'server'")
        client = Client(self, name, weight)
        self.clients.append(client)
        return client

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
        from .compiler.split import split_objective
        expr = as_expr(expr)
        for leaf in expr.leaves():
            if getattr(leaf, "problem_id", self.uid) != self.uid:
                raise FedModelError(f"objective uses {leaf.name!r}, which belongs to another Problem")
        split_objective(self, expr)

    def subject_to(self, *constraints: Constraint) -> None:
        """Add constraints written as if centralized; data-coupled ones are decoupled with slacks."""
        from .compiler.split import split_constraint
        for constraint in _flatten(constraints):
            if not isinstance(constraint, Constraint):
                raise FedModelError(f"subject_to takes constraints such as `expr <= 0`, got {constraint!r}")
            split_constraint(self, constraint)

    # ---- bookkeeping ----------------------------------------------------------------------
    def fresh_constraint_name(self, owner: str) -> str:
        while True:
            k = self._counters.get(owner, 0)
            self._counters[owner] = k + 1
            name = f"{owner}.con{k}"
            if name not in self._constraint_names:
                return name

    def claim_constraint_name(self, name: str) -> None:
        if name in self._constraint_names:
            raise FedModelError(f"constraint name {name!r} is used twice in problem {self.name!r}")
        self._constraint_names.add(name)

    def add_slack(self, slack: Variable) -> None:
        slack.problem_id = self.uid
        self.slacks.append(slack)

    # ---- whole-model views ----------------------------------------------------------------
    @property
    def objective(self) -> Expression:
        return add(*[b.objective for b in self.blocks])

    @property
    def constraints(self) -> list[Constraint]:
        return [c for b in self.blocks for c in b.constraints]

    def variables(self) -> list[Variable]:
        """All variables, shared first (in order of appearance), then private ones."""
        seen: dict[int, Variable] = {}
        exprs = [t for b in self.blocks for t in b.terms] + [c.expr for c in self.constraints]
        for expr in exprs:
            for var in expr.variables():
                seen.setdefault(var.uid, var)
        for slack in self.slacks:
            seen.setdefault(slack.uid, slack)
        variables = list(seen.values())
        names: dict[str, Variable] = {}
        for var in variables:
            if var.name in names:
                raise FedModelError(f"two different variables are named {var.name!r} in problem "
                                    f"{self.name!r}; give them distinct names")
            names[var.name] = var
        return [v for v in variables if v.owner is None] + [v for v in variables if v.owner is not None]

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

    def is_convex(self) -> bool:
        return self.objective.is_convex() and all(c.is_dcp() for c in self.constraints)

    # ---- solving --------------------------------------------------------------------------
    def to_cvxpy(self):
        """The centralized `cvxpy.Problem` of this model (same objective, all constraints)."""
        from .lowering.problem import lower_problem
        return lower_problem(self)[0]

    def solve(self, backend: Any = "proxal", topology: Any = None, executor: Any = "serial",
              callback: Any = None, verbose: bool = False, checkpoint: str | None = None,
              checkpoint_every: int | None = None, resume: bool = False, **options: Any):
        """Solve with a backend (instance or name); see API.md §2 for the arguments."""
        from backends import make_backend
        self.validate()
        solver = make_backend(backend, **options)
        result = solver.solve(self, topology=topology, executor=executor, callback=callback,
                              verbose=verbose, checkpoint=checkpoint,
                              checkpoint_every=checkpoint_every, resume=resume)
        for var in self.variables():
            if var.uid in result.values:
                var.value = result.values[var.uid]
        return result
