"""A problem's blocks: the server (global constraints, regularizer) and the clients (objective
terms and local constraints over private data, private variables), and the checks of the arrays
a user hands them."""
from __future__ import annotations

from typing import Any

import numpy as np

from .atoms import add
from .constraints import Constraint
from .errors import DataError, FedModelError, ShapeError
from .expression import Constant, Data, Expression, Variable, as_expr, is_sparse, sparse_csr


class Block:
    """A node's share of the model: objective terms, constraints, data (and private variables)."""

    kind = "block"

    def __init__(self, problem: Any, name: str):     # (its Problem; problem.py imports us)
        self.problem = problem
        self.name = name
        self.terms: list[Expression] = []
        self.constraints: list[Constraint] = []
        self.data_items: list[Data] = []
        self.private_variables: list[Variable] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, terms={len(self.terms)}, constraints={len(self.constraints)})"

    # ---- declarations ---------------------------------------------------------------------
    def data(self, array: Any = None, name: str | None = None, *, loader: Any = None,
             shape: Any = None) -> Data:
        """A constant owned by this block: it never leaves the node that holds it.

        `data(loader=f, shape=s)` instead of an array: `f()` is called where the node program
        runs (a Ray worker; in-process for the serial executor), so the driver never holds it."""
        name = name if name is not None else f"{self.name}_data{len(self.data_items)}"
        if any(d.name == name for d in self.data_items):
            raise FedModelError(f"block {self.name!r} already has data named {name!r}; "
                                "use a different name")
        if loader is not None or shape is not None:
            return self._loader_data(array, name, loader, shape)
        if isinstance(array, Expression):
            raise DataError(f"data {name!r} of block {self.name!r} must be a numeric array, not "
                            "an expression")
        array = _numeric_array(array, f"data {name!r} of block {self.name!r}")
        item = Data(array, owner=self.name, name=name)
        item.problem_id = self.problem.uid
        self.data_items.append(item)
        return item

    def _loader_data(self, array: Any, name: str, loader: Any, shape: Any) -> Data:
        what = f"data {name!r} of block {self.name!r}"
        if array is not None:
            raise FedModelError(f"{what}: give either an array or loader=..., not both")
        if not callable(loader):
            raise DataError(f"{what}: loader must be a callable returning the array, got "
                            f"{type(loader).__name__}")
        if shape is None:
            raise ShapeError(f"{what}: a loader needs shape=... (the driver never sees the "
                             "array, but the model needs its shape)")
        item = Data(None, owner=self.name, name=name, loader=loader, shape=shape)
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
        """Add constraints (`a <= b`, `a >= b`, `a == b`) owned by this block.

        All constraints are checked before any is added, so a bad one leaves the block unchanged.
        """
        constraints = flatten_constraints(constraints)
        names: set[str] = set()
        for constraint in constraints:
            if not isinstance(constraint, Constraint):
                raise FedModelError(f"subject_to on block {self.name!r} takes constraints such as "
                                    f"`expr <= 0`, got {constraint!r}")
            self._check_access(constraint.expr, f"constraint {constraint!r}")
            if constraint.owner is not None or any(constraint is c for c in self.constraints):
                raise FedModelError(f"constraint {constraint!r} was already added to block "
                                    f"{constraint.owner!r}; build a new constraint instead")
            if constraint.name is not None:
                if constraint.name in names:
                    raise FedModelError(f"constraint name {constraint.name!r} is used twice in "
                                        f"one subject_to call on block {self.name!r}")
                self.problem.check_constraint_name(constraint.name, self.name)
                names.add(constraint.name)
        for constraint in constraints:
            if constraint.name is None:
                constraint.name = self.problem.fresh_constraint_name(self.name)
            self.problem.claim_constraint_name(constraint.name, self.name)
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



def _numeric_array(array: Any, what: str) -> np.ndarray:
    """`array` as a real numpy array of at most 2 dimensions, or a DataError / ShapeError that
    names the block and the data (NaN/inf and non-numeric entries are caught by `Data`)."""
    if array is None:
        raise DataError(f"{what} is None; pass a numeric array")
    if is_sparse(array):     # kept sparse, as CSR (`expression.sparse_csr`)
        out = sparse_csr(array, what)
        if 0 in out.shape:
            raise DataError(f"{what} is empty (shape {out.shape}); give every block non-empty "
                            "data or remove the block")
        # a sparse column is a vector: dense, it broadcasts in `y - X @ w` as numpy's
        # (scipy's sparse-minus-dense broadcast fails with a bare numpy error at solve time)
        return out.toarray() if out.shape[1] == 1 else out
    if np.ma.isMaskedArray(array) and np.ma.is_masked(array):
        raise DataError(f"{what} is a masked array with {int(np.ma.count_masked(array))} masked "
                        "entries, which fedmodel would read as numbers; remove those rows or "
                        "fill them (array.filled(value)) first")
    try:
        out = np.asarray(array)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} is not a rectangular numeric array ({exc}); convert it to a "
                        "float array first") from None
    if out.dtype.kind == "c":
        raise DataError(f"{what} is complex; fedmodel works with real numbers (split it into "
                        "real and imaginary parts)")
    if out.dtype.kind in "mM":    # numpy would cast them to counts of their unit silently
        raise DataError(f"{what} holds dates or durations ({out.dtype}); convert them to "
                        "numbers in the unit you mean first (e.g. days since a start date)")
    if out.dtype.kind in "OUSV":
        try:
            out = out.astype(float)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{what} is not numeric ({exc}){_columns_hint(array)}; convert it "
                            "to a float array first") from None
    columns = getattr(array, "columns", None)     # a DataFrame: name the column of a NaN
    if columns is not None and out.ndim == 2 and out.dtype.kind == "f" and not np.all(np.isfinite(out)):
        rows, cols = np.nonzero(~np.isfinite(out))
        raise DataError(f"{what} has {len(rows)} non-finite entr{'y' if len(rows) == 1 else 'ies'} "
                        f"(first in row {int(rows[0])}, column {columns[cols[0]]!r}); remove or "
                        "impute NaN/inf before building the model")
    if out.size == 0:
        raise DataError(f"{what} is empty (shape {out.shape}); give every block non-empty data "
                        "or remove the block")
    if out.ndim > 2:
        raise ShapeError(f"{what} has shape {out.shape}: only scalars, vectors and matrices are "
                         "supported; reshape it to 2-D")
    return out


def _columns_hint(array: Any) -> str:
    """A DataFrame's non-numeric columns, named (a user one-hot encodes them), else ""."""
    dtypes = getattr(array, "dtypes", None)
    if not hasattr(dtypes, "items"):
        return ""
    named = [str(k) for k, t in dtypes.items() if getattr(t, "kind", "O") not in "biuf"]
    return (f" in column(s) {named} (encode them as numbers, e.g. categories one-hot with "
            "pandas.get_dummies)") if named else ""


def flatten_constraints(items) -> list:
    """Constraints given as arguments, lists or tuples (nested), as one flat list."""
    out = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out.extend(flatten_constraints(item))
        else:
            out.append(item)
    return out


class Client(Block):
    """A client: private data, objective terms, local constraints, private variables."""

    kind = "client"

    def __init__(self, problem: Any, name: str, weight: float | None = None):
        super().__init__(problem, name)
        if weight is not None:
            try:
                if isinstance(weight, (str, bytes)):   # float("2") would take it
                    raise TypeError
                weight = float(weight)
            except (TypeError, ValueError):
                raise FedModelError(f"weight of client {name!r} must be a positive number, got "
                                    f"{weight!r}") from None
            if not np.isfinite(weight) or weight <= 0:
                raise FedModelError(f"weight of client {name!r} must be a positive number, got "
                                    f"{weight!r}")
        self.weight = weight

    def variable(self, shape: int | tuple = (), name: str | None = None) -> Variable:
        """A variable private to this client (no consensus), e.g. a slack.

        Its name is scoped to the client: every client may declare its own `s`, shown as
        `client.s` (`var.label`). Within one client names are unique, and a private name may
        not repeat a shared variable's name (inside the client `s` would be ambiguous)."""
        name = name if name is not None else f"{self.name}_var{len(self.private_variables)}"
        if any(v.name == name for v in self.private_variables):
            raise FedModelError(f"client {self.name!r} already has a private variable named "
                                f"{name!r}; give this one a different name")
        var = Variable(shape, name=name)
        var.owner = self.name
        var.problem_id = self.problem.uid
        self.private_variables.append(var)
        return var


class Server(Block):
    """The server: global constraints and the (possibly nonsmooth) regularizer h."""

    kind = "server"
