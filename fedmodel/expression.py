"""The expression IR: a DAG of leaves (variables, parameters, constants, owned data) and atoms.

Every expression knows its shape and, through its atom, its value, derivative rule, curvature,
sign and smoothness. This module holds the base class, the leaves, the DAG walk (`postorder`)
and the interpreter behind `.value` (`evaluate`). Operators build atoms and constraints, which
live above it: `fedmodel.atoms` and `fedmodel.constraints` register their constructors in
`OPERATORS` when imported.
"""
from __future__ import annotations

import itertools
import numbers
import sys
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from . import analysis
from .analysis import AFFINE, CONCAVE, CONSTANT, CONVEX, NONMONOTONE, elementwise_sign
from .errors import DataError, FedModelError, ShapeError

Shape = tuple[int, ...]
_ids = itertools.count()


def as_shape(shape: int | tuple | list | None) -> Shape:
    """Normalize an int / tuple shape; () is a scalar."""
    if shape is None:
        return ()
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, numbers.Integral) for s in shape):
        # Variable(3.0), Variable("a"): a TypeError from int() or iter() told the user nothing
        raise ShapeError(f"shape {shape!r} is not supported: use a positive int or a 1- or 2-tuple "
                         "of ints, e.g. Variable(3) or Variable((3, 2))")
    shape = tuple(int(s) for s in shape)
    if len(shape) > 2 or any(s <= 0 for s in shape):
        raise ShapeError(f"shape {shape} is not supported: use a positive int or a 1- or 2-tuple")
    return shape


def size_of(shape: Shape) -> int:
    return int(np.prod(shape)) if shape else 1


# name → constructor of the node an operator builds: "add", "neg", "multiply", "divide",
# "matmul", "power", "index", "transpose" (fedmodel/atoms/__init__.py), "inequality",
# "equality" (fedmodel/constraints.py). Both modules fill it when imported, and importing any
# fedmodel module imports them first (through fedmodel/__init__.py).
OPERATORS: dict[str, Callable[..., Any]] = {}


def _operator(name: str, reflected: bool = False) -> Callable[[Any, Any], Any]:
    """The method `self ∘ other` of a binary operator: `OPERATORS[name](self, other)`, or
    `OPERATORS[name](other, self)` for the reflected method (`__radd__`, …)."""
    symbol = SYMBOLS.get(name)

    def method(self: Any, other: Any) -> Any:
        left, right = (other, self) if reflected else (self, other)
        if symbol:
            check_crossing(symbol, left, right)
        return OPERATORS[name](left, right)
    return method


class BroadcastWarning(UserWarning):
    """An entrywise operator broadcast a vector of shape (m,) against a column (m, 1) into an
    (m, m) array, as numpy and CVXPY do: almost always a column meant as the vector."""


SYMBOLS = {"add": "+", "multiply": "*", "divide": "/", "inequality": "<=", "equality": "=="}


def check_crossing(symbol: str, left: Any, right: Any) -> None:
    """Warn (`BroadcastWarning`, at the user's line) when `left symbol right` broadcasts an (m,)
    operand against an (m, 1) one, m > 1: `X @ w - y` with y a column of m labels is an (m, m)
    residual, each prediction against every label — a model of another size, solved silently
    (issue 25: the answer was of that other model). Not an error: numpy and CVXPY allow it.
    Called by an operator or atom the user called; fedmodel's own calls (a constraint's
    `lhs - rhs`, derived gradients) are not the user's writing and say nothing."""
    a, b = getattr(left, "shape", None), getattr(right, "shape", None)
    if a is None or b is None or len(a) + len(b) != 3:
        return
    vector, column = (a, b) if len(a) == 1 else (b, a)
    if len(vector) != 1 or vector[0] < 2 or tuple(column) != (vector[0], 1):
        return
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller == "fedmodel" or caller.startswith("fedmodel."):
        return
    m = vector[0]
    warnings.warn(
        f"{_operand(left)} (shape {tuple(a)}) {symbol} {_operand(right)} (shape {tuple(b)}) "
        f"broadcasts to shape ({m}, {m}), as in numpy and CVXPY: each of the {m} entries of the "
        f"vector meets each entry of the column, which is another model than {m} entrywise "
        "pairs. If the (m, 1) operand is a column of m values (labels y read as a column), pass "
        "it flat: y.ravel() (or y[:, 0], or data(y.ravel()))", BroadcastWarning, stacklevel=3)


def _operand(x: Any) -> str:
    if isinstance(x, Expression):
        text = x.render()
        return text if len(text) <= 40 else text[:37] + "..."
    return "an array" if isinstance(x, np.ndarray) else f"a {type(x).__name__}"


class Expression:
    """Base of every node of the IR. Subclasses: `Leaf` kinds and `fedmodel.atoms.Atom`."""

    __array_priority__ = 100  # numpy defers `A @ w`, `A * w` to our reflected operators
    shape: Shape
    args: tuple["Expression", ...] = ()

    # ---- structure -------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return size_of(self.shape)

    def leaves(self) -> list["Leaf"]:
        """Distinct leaves of the DAG, in first-visit order."""
        seen: dict[int, Leaf] = {}
        stack: list[Expression] = [self]
        visited: set[int] = set()
        while stack:
            node = stack.pop()
            if id(node) in visited:
                continue
            visited.add(id(node))
            if isinstance(node, Leaf):
                seen.setdefault(node.uid, node)
            else:
                stack.extend(reversed(node.args))
        return list(seen.values())

    def variables(self) -> list["Variable"]:
        return [leaf for leaf in self.leaves() if isinstance(leaf, Variable)]

    def parameters(self) -> list["Parameter"]:
        return [leaf for leaf in self.leaves() if isinstance(leaf, Parameter)]

    def data_owners(self) -> set[str]:
        """Names of the blocks whose data this expression reads (not counting plain constants)."""
        return {leaf.owner for leaf in self.leaves() if isinstance(leaf, Data)}

    def is_constant(self) -> bool:
        """True when no Variable occurs (parameters count as constants, as in CVXPY)."""
        return not self.variables()

    # ---- what the DCP rules read (fedmodel/analysis.py); atoms override ---------------------
    curvature = CONSTANT          # of the node's own function (leaves: constant, Variable: affine)
    smooth = True                 # differentiable everywhere on its domain
    squares = False               # the node is its argument squared (x², ‖x‖², x**2)
    smooth_when_squared = False   # its only kink is one a square smooths out ([x]₊² is C¹)
    curvature_jumps = False       # C¹ but its second derivative jumps (huber at ±M)

    def monotonicity(self, index: int) -> str:
        """How the node's function moves with argument `index` (INCREASING, DECREASING, …)."""
        return NONMONOTONE

    def sign(self) -> tuple[bool, bool]:
        """(is nonnegative, is nonpositive): an atom's from its arguments' signs."""
        return (False, False)

    # ---- analysis (fedmodel/analysis.py) ----------------------------------------------------
    def is_convex(self) -> bool:
        return analysis.curvature(self) in (CONSTANT, AFFINE, CONVEX)

    def is_concave(self) -> bool:
        return analysis.curvature(self) in (CONSTANT, AFFINE, CONCAVE)

    def is_affine(self) -> bool:
        return analysis.curvature(self) in (CONSTANT, AFFINE)

    def is_dcp(self) -> bool:
        return self.is_convex() or self.is_concave()

    def is_smooth(self) -> bool:
        return analysis.is_smooth(self)

    def is_nonneg(self) -> bool:
        return self.sign()[0]

    def is_nonpos(self) -> bool:
        return self.sign()[1]

    # ---- value ----------------------------------------------------------------------------
    @property
    def value(self) -> np.ndarray | float | None:
        """Numeric value when every leaf has one (after a solve, or set by hand), else None."""
        try:
            return evaluate(self)
        except _MissingValue:
            return None

    # ---- operators: each builds the node of its OPERATORS constructor (registered by
    # fedmodel.atoms / fedmodel.constraints); `__r…__` is the reflected form (`2 * x`) ------
    __add__, __radd__ = _operator("add"), _operator("add", reflected=True)
    __mul__, __rmul__ = _operator("multiply"), _operator("multiply", reflected=True)
    __truediv__, __rtruediv__ = _operator("divide"), _operator("divide", reflected=True)
    __matmul__, __rmatmul__ = _operator("matmul"), _operator("matmul", reflected=True)
    __pow__, __getitem__ = _operator("power"), _operator("index")
    # comparisons build constraints: `a >= b` is `b <= a`
    __le__, __ge__ = _operator("inequality"), _operator("inequality", reflected=True)
    __eq__ = _operator("equality")

    def __lt__(self, other: Any) -> None:
        raise FedModelError("strict inequalities are not allowed (as in CVXPY): write <= or >=")

    __gt__ = __lt__

    def __sub__(self, other: Any) -> "Expression":
        check_crossing("-", self, other)
        return OPERATORS["add"](self, OPERATORS["neg"](other))

    def __rsub__(self, other: Any) -> "Expression":
        check_crossing("-", other, self)
        return OPERATORS["add"](other, OPERATORS["neg"](self))

    def __neg__(self) -> "Expression":
        return OPERATORS["neg"](self)

    def __pos__(self) -> "Expression":
        return self

    @property
    def T(self) -> "Expression":
        return OPERATORS["transpose"](self)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise FedModelError(
            "an expression has no truth value; did you use `and`/`or`/`if` on a constraint? "
            "Pass constraints to subject_to(...) one by one")

    # ---- rendering ------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self}, shape={self.shape})"

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:  # overridden by leaves and atoms
        raise NotImplementedError


class _MissingValue(Exception):
    """Internal: a leaf without a value was reached while evaluating `.value`."""


class Leaf(Expression):
    """A node without arguments. `uid` identifies it across copies and processes."""

    def __init__(self, shape: Shape, name: str | None):
        self.shape = as_shape(shape)
        self.uid = next(_ids)
        self.name = name if name is not None else f"{self._prefix}{self.uid}"
        if not isinstance(self.name, str) or not self.name:
            raise FedModelError(f"name {name!r} must be a non-empty string")

    _prefix = "x"

    @property
    def label(self) -> str:
        """The leaf's problem-wide name: `client.name` for a client's private variable or data
        (their names are scoped to the client, so two clients may both have an `s`), the bare
        name for everything else (shared variables, parameters, the server's data)."""
        owner = getattr(self, "owner", None)
        return f"{owner}.{self.name}" if owner is not None and owner != "server" else self.name

    def render(self) -> str:
        return self.name

    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _reserve_uid(self.uid)


def _reserve_uid(uid: int) -> None:
    """Leaves unpickled in another process (a Ray worker) keep their uids; later leaves made
    there (e.g. a merit's parameters) must not reuse them, or plans would confuse the two."""
    global _ids
    following = next(_ids)
    _ids = itertools.count(max(following, uid + 1))


def is_sparse(value: Any) -> bool:
    """Whether `value` is a scipy.sparse matrix or array (checked without importing scipy)."""
    return hasattr(value, "tocsr") and hasattr(value, "nnz") and not isinstance(value, np.ndarray)


def sparse_csr(value: Any, what: str) -> Any:
    """scipy.sparse data as a float64 `csr_array` in canonical form (sorted, summed
    duplicates), its stored entries checked finite: `X @ w` and `X.T @ r` on it are sparse
    products (a CSR row product and a CSC column product), never densified. csr_array, not
    csr_matrix: its `*` is elementwise, as numpy's (csr_matrix's `*` is a matrix product)."""
    import scipy.sparse as sp
    if np.dtype(value.dtype).kind == "c":
        raise DataError(f"{what} is complex; fedmodel works with real numbers (split it into "
                        "real and imaginary parts)")
    if len(value.shape) != 2:
        raise ShapeError(f"{what} has shape {value.shape}: sparse data must be a 2-D matrix")
    try:
        out = sp.csr_array(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} is not numeric ({exc}); convert it to a float matrix first") from None
    if out is value:
        out = out.copy()        # the user's matrix is theirs: canonicalizing must not edit it
    out.sum_duplicates()        # (also sorts the indices)
    if max(out.nnz, *out.shape) < 2**31 - 1:   # one 32-bit index type: scipy converts mixed or
        out.indices = out.indices.astype(np.int32, copy=False)   # 64-bit indices per product
        out.indptr = out.indptr.astype(np.int32, copy=False)
    if not np.all(np.isfinite(out.data)):
        bad = int(np.flatnonzero(~np.isfinite(out.data))[0])
        row = int(np.searchsorted(out.indptr, bad, side="right") - 1)
        raise DataError(
            f"{what} has {int(np.sum(~np.isfinite(out.data)))} non-finite stored entries (first "
            f"at index ({row}, {int(out.indices[bad])})); remove or impute NaN/inf before "
            "building the model")
    return out


def _check_numeric(value: Any, what: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what} is not numeric ({exc}); convert it to a float array first") from exc
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))
        where = tuple(int(i) for i in bad[0]) if array.ndim else ()
        raise DataError(
            f"{what} has {len(bad)} non-finite entr{'y' if len(bad) == 1 else 'ies'} "
            f"(first at index {where}); remove or impute NaN/inf before building the model")
    return array


class Variable(Leaf):
    """An optimization variable: shared (consensus across nodes) unless made by `client.variable`.

    >>> w = Variable(3, name="w"); w.shape
    (3,)
    """

    _prefix = "var"
    curvature = AFFINE

    def __init__(self, shape: int | tuple = (), name: str | None = None):
        super().__init__(as_shape(shape), name)
        self.owner: str | None = None  # set for client-private variables
        self._value: np.ndarray | None = None

    def render(self) -> str:
        return self.label     # a private `s` of client c3 reads `c3.s` wherever it is shown

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, val) -> None:
        if val is None:
            self._value = None
            return
        array = _check_numeric(val, f"value of variable {self.label!r}")
        # a copy: `w.value = res.value(w)` is the user's start, not the array the solve left
        # (`compiler.start` tells the two apart by identity), and later edits of `val` stay theirs
        self._value = _fit_shape(array.copy(), self.shape, f"variable {self.label!r}")


class Parameter(Leaf):
    """A value that can change between evaluations or solves without recompiling. As in CVXPY,
    `nonneg=True` / `nonpos=True` declare its sign: checked on every assignment (DataError) and
    used by the DCP rules, so `lam * sum_squares(w)` with a nonneg `lam` is convex."""

    _prefix = "param"
    assignments = 0      # values set so far (all parameters): compiled caches compare it

    def __init__(self, shape: int | tuple = (), name: str | None = None, value: Any = None,
                 nonneg: bool = False, nonpos: bool = False):
        super().__init__(as_shape(shape), name)
        self.nonneg, self.nonpos = bool(nonneg), bool(nonpos)
        self._value: np.ndarray | None = None
        if value is not None:
            self.value = value

    def sign(self) -> tuple[bool, bool]:
        """The declared sign (never the current value's: the value may change after the
        expression's curvature was decided)."""
        return (getattr(self, "nonneg", False), getattr(self, "nonpos", False))

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, val) -> None:
        Parameter.assignments += 1
        if val is None:
            self._value = None
            return
        array = _check_numeric(val, f"value of parameter {self.name!r}")
        for declared, wrong, word in ((getattr(self, "nonneg", False), array < 0, "nonneg"),
                                      (getattr(self, "nonpos", False), array > 0, "nonpos")):
            if declared and np.any(wrong):
                bad = float(array[wrong].flat[0]) if array.ndim else float(array)
                raise DataError(f"parameter {self.name!r} is declared {word}=True but was given "
                                f"{bad:g}; assign a value of that sign, or declare the parameter "
                                "without it")
        self._value = _fit_shape(array, self.shape, f"parameter {self.name!r}")

    def _assign(self, array: np.ndarray) -> None:
        """`value = array` without its checks, for the runtime's own writes (a local solve's
        multipliers: thousands a step, where the checks cost ~3/4 of the write): the caller
        guarantees a finite float array of this shape and the declared sign."""
        Parameter.assignments += 1
        self._value = array


def _fit_shape(array: np.ndarray, shape: Shape, what: str) -> np.ndarray:
    if array.shape == shape:
        return array
    if array.size == size_of(shape) and array.squeeze().shape == tuple(s for s in shape if s != 1):
        return array.reshape(shape)
    raise ShapeError(f"{what} has shape {shape} but was given a value of shape {array.shape}")


class Constant(Leaf):
    """A numeric constant (numpy arrays and Python numbers are wrapped into this)."""

    _prefix = "const"

    def __init__(self, value: Any, name: str | None = None):
        what = "constant" if name is None else f"constant {name!r}"
        # scipy.sparse stays sparse (a CSR array): see `sparse_csr`
        array = sparse_csr(value, what) if is_sparse(value) else _check_numeric(value, what)
        if array.ndim > 2:
            raise ShapeError(f"constant of shape {array.shape}: only scalars, vectors and matrices")
        self._array = array
        super().__init__(array.shape if array.ndim else (), name)
        self.shape = array.shape

    @property
    def value(self) -> np.ndarray:
        return self._array

    def sign(self) -> tuple[bool, bool]:
        if is_sparse(self.value):    # the implicit zeros are both signs
            return elementwise_sign(self.value.data)
        return elementwise_sign(self.value)

    def render(self) -> str:
        if self.name.startswith(self._prefix) and self._array.size == 1:
            return f"{self._array.item():g}"   # .item(): also for shapes (1,) and (1, 1)
        return self.name


SKINNY_COLUMNS = 64   # data with at most this many columns is stored column-major (`_matvec_layout`)


def _matvec_layout(array: np.ndarray) -> np.ndarray:
    """A tall, skinny data matrix in column-major order: `X @ w` and `X.T @ r` are then
    column-wise BLAS passes instead of one short dot product per row, ~1.6× faster at 14
    columns (adult), and the gradient of a model over it is mostly these products. Wider
    matrices keep their layout (no copy): row dot products are long enough there."""
    if isinstance(array, np.ndarray) and array.ndim == 2 and \
            array.shape[1] <= SKINNY_COLUMNS < array.shape[0] and not array.flags.f_contiguous:
        return np.asfortranarray(array)
    return array


class RemoteDataError(DataError):
    """Data produced on a worker by a loader was needed on the driver (evaluation, CVXPY)."""


class Data(Constant):
    """A constant owned by one block (a client or the server): it never leaves its owner.

    With `loader` (a picklable callable returning the array) instead of a value, the data is
    produced where the node program runs: the driver knows only its `shape` (docs/ray.md)."""

    _prefix = "data"

    def __init__(self, value: Any, owner: str, name: str | None = None, loader: Any = None,
                 shape: Any = None):
        self.owner = owner
        self.loader = loader
        if loader is not None:
            Leaf.__init__(self, as_shape(shape), name)
            self._array = None   # filled by `load()` on the node that owns the data
            return
        try:
            super().__init__(value, name)
        except DataError as exc:
            raise DataError(f"data {name or ''} of block {owner!r}: {exc}") from None
        if 0 in self._array.shape:     # (not .size: a sparse matrix's is its stored entries)
            raise DataError(f"data {self.name!r} of block {owner!r} is empty (shape {self._array.shape})")
        self._array = _matvec_layout(self._array)

    @property
    def remote(self) -> bool:
        """True while the data has a loader that has not run in this process."""
        return self._array is None

    @property
    def value(self) -> np.ndarray:
        if self._array is None:
            raise RemoteDataError(
                f"data {self.name!r} of {_owner(self.owner)} is produced on the worker by its "
                "loader and is not held here, so it cannot be evaluated, lowered to CVXPY or "
                "verified in this process. Solve with a federated backend (node programs load "
                "it where they run), or call prob.load_data() to load it here")
        return self._array

    def load(self) -> np.ndarray:
        """Run the loader (on the node that owns the data) and check what it returns; a
        failure is a DataError naming the block, never the loader's own traceback."""
        if self._array is not None:
            return self._array
        where = f"data {self.name!r} of {_owner(self.owner)}"
        try:
            out = self.loader()
        except Exception as exc:   # any failure of user code becomes a DataError naming the client
            raise DataError(f"the loader of {where} raised {type(exc).__name__}: {exc}") from None
        what = f"{where} (returned by its loader)"
        array = sparse_csr(out, what) if is_sparse(out) else _check_numeric(out, what)
        if array.shape != self.shape:
            raise DataError(f"the loader of {where} returned shape {array.shape}, but the data "
                            f"was declared with shape={self.shape}")
        self._array = _matvec_layout(array)
        return self._array

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self.loader is not None:   # never ship loaded data: it is produced where it lives
            state["_array"] = None
        return state

    def render(self) -> str:
        return self.name


def _owner(owner: str) -> str:
    return "the server" if owner == "server" else f"client {owner!r}"


def as_expr(value: Any) -> Expression:
    """Wrap numbers and arrays as `Constant`; pass expressions through."""
    if isinstance(value, Expression):
        return value
    if is_sparse(value):     # stays sparse (`Constant`, `sparse_csr`)
        return Constant(value)
    if isinstance(value, (numbers.Number, np.ndarray, list, tuple, np.generic)):
        return Constant(value)
    raise FedModelError(
        f"cannot use a {type(value).__name__} in an expression; use numbers, numpy arrays or "
        "fedmodel expressions")


def postorder(outputs: Sequence[Expression]) -> list[Expression]:
    """The distinct nodes of the DAGs of `outputs`, each listed once, after its arguments."""
    order: list[Expression] = []
    seen: set[int] = set()
    for root in outputs:
        stack: list[tuple[Expression, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in seen:
                continue
            if expanded or isinstance(node, Leaf):
                seen.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((arg, False) for arg in reversed(node.args))
    return order


def evaluate(expr: Expression) -> Any:
    """Value of `expr` from the current values of its leaves, node by node (the interpreter
    behind `.value`; compiled plans are `fedmodel.compiler.codegen.Plan`). Raises
    `_MissingValue` when a leaf has no value."""
    memo: dict[int, Any] = {}
    for node in postorder([expr]):
        if isinstance(node, Leaf):
            value = node.value
            if value is None:
                raise _MissingValue(node.name)
            memo[id(node)] = value
        else:
            memo[id(node)] = node.numeric(*[memo[id(a)] for a in node.args])
    out = memo[id(expr)]
    return float(out) if np.ndim(out) == 0 else np.asarray(out)
