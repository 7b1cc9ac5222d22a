"""Newton systems of a client with few data rows: ∇²P_i = diag(λ) + Q C Qᵀ, solved by
Sherman–Morrison–Woodbury through an r × r system, never an N × N matrix.

A client's loss of `X @ w` (least squares, logistic, a constraint's AL term on it) plus
separable terms (the method's proximal terms, a ridge) has the Hessian Xᵀ S X + diag(λ):
rank ≤ m (the rows) plus a diagonal (paper 1, eq. 19's local Newton systems). With m well below
N (sparse features, few rows: issue 25's d = 2,000, 4 × 50 rows) the dense path —
an N × N Hessian, its eigendecomposition (O(N³), ~1 s at N = 2,000) and an O(N²) product per
direction — costs far more than the data. Here:
- the data matrices are the constants `A` of the products `A @ (s ∘ v)` in the compiled
  Hessian-vector product ∇(∇P_i·v) (`CompiledMerit._hvp_expressions`; s the compiler's column
  scales, or none); Q (N × r) is an orthonormal basis of the rows of A·diag(s), once per
  program (`row_basis`: for sparse A kept as Q = (A·diag(s))ᵀ T from the rows' Gram matrix,
  so a product with Q costs O(nnz + m r), not O(N r)); a node without such products
  (a server's ridge) has r = 0: a diagonal;
- λ is that product with every `A @ (s ∘ v)` replaced by 0, at v = 1 (the terms that do not
  go through the data); C = Qᵀ(∇²P_i − diag λ)Q from r directions of the batched product;
- every packed Hessian is checked on a random direction: ∇²P_i v = λ∘v + Q C Qᵀ v to 1e-8
  (a Hessian of any other form, e.g. with cross terms, fails it: the program then keeps the
  dense path for good);
- (∇²P_i + diag w)⁻¹ g = D⁻¹g − D⁻¹Q (I + C K)⁻¹ C Qᵀ D⁻¹ g, D = diag(λ + w), K = QᵀD⁻¹Q:
  O(N r²) per Hessian or weight (O(nnz·m) with a sparse basis), O(N r) per direction (O(nnz + m
  r)); S (hence C) may be singular (a saturated logistic row), only D must be positive (else the
  caller takes the dense inverse of `dense(packed, basis)`, within the dense budget).
The packed Hessian is one flat array (`pack`: λ and C; Q is derived from the program's data),
kept where the dense one is kept (`NodeState.hessian`): checkpoints and resumed solves see plain
data. Beyond the dense budget (`solvers.DENSE_NEWTON_FLOATS`) this form is what lets the
"exact" and "newton" solves run at all (`local_solvers.choose`): d = 10⁵, 150 rows a client.
"""
from __future__ import annotations

import numpy as np

from ..compiler.codegen import Plan
from ..expression import Constant, Leaf
from . import solvers
from .compiled_merit import HESSIAN_BLOCK_FLOATS
from .data_products import check_direction, data_product

# the low-rank form is taken when the data rows are at most this fraction of the unknowns:
# beyond, the r × r work (O(N r²) per Hessian) nears the dense path's and m ≥ N keeps it bitwise
MAX_ROW_FRACTION = 0.5
# a diagonal Hessian (a server's ridge, no data) is kept as one from this many unknowns: below,
# the dense path's eigendecomposition takes milliseconds and its results stay bitwise
DIAGONAL_MIN = 500
# below this many unknowns the dense path is kept: an N × N Hessian and its eigendecomposition
# cost microseconds there, while the packed form makes the batched executor solve each client on
# its own (`batched_group`); measured (NP monks-1, N = 18, n = 200): a step 627 → 158 µs
MIN_UNKNOWNS = 64
GUARD_TOL = 1e-8     # relative mismatch on the random direction above which the form is refused
# Gram eigenvalues kept (`row_basis`): above this fraction of the largest (singular values 1e-6)
GRAM_FLOOR = 1e-12
_UNSET = object()


class _Structure:
    """What a program's Hessians are packed from: the plan of the diagonal part (its direction
    the Parameter `direction`), the basis Q of the data rows."""

    __slots__ = ("diagonal_plan", "direction", "basis")

    def __init__(self, diagonal_plan: Plan, direction, basis: "Basis"):
        self.diagonal_plan, self.direction, self.basis = diagonal_plan, direction, basis


def structure(program) -> "_Structure | None":
    """The program's low-rank structure (analysed once, kept on the program), or None when its
    Hessian is not diagonal plus a product through few data rows (or failed the check once)."""
    found = program.__dict__.get("_low_rank", _UNSET)
    if found is _UNSET:
        found = program._low_rank = _analyse(program)
    return found


def applies(program) -> bool:
    """Whether `hessian(program, z)` packs this program's Hessians (see `structure`)."""
    return structure(program) is not None


def _analyse(program) -> "_Structure | None":
    if program.n_private or len(program.variables) != 1 or program.variables[0].ndim != 1:
        return None
    n = program.n_shared
    if n < MIN_UNKNOWNS:
        return None
    products, directions = program.compiled._hvp_expressions
    direction = directions[0]
    matrices: dict[tuple, tuple] = {}
    memo: dict[int, object] = {}

    def without_data(node):
        """`node` with every `A @ (s ∘ v)` (A a constant vector or matrix, s constant column
        scales of the compiler's equilibration, or none) replaced by 0."""
        if id(node) not in memo:
            args = getattr(node, "args", ())
            product = data_product(node, direction)
            if product is not None and isinstance(args[0], Constant) and args[0].ndim in (1, 2):
                scale = product[1]
                matrices.setdefault((args[0].uid, id(scale)), (args[0], scale))
                memo[id(node)] = Constant(np.zeros(node.shape))
            elif isinstance(node, Leaf):
                memo[id(node)] = node
            else:
                new = [without_data(a) for a in args]
                memo[id(node)] = node if all(a is b for a, b in zip(new, args)) else node.with_args(*new)
        return memo[id(node)]

    diagonal = without_data(products[0])
    rows = sum(a.shape[0] if a.ndim == 2 else 1 for a, _ in matrices.values())
    if rows > MAX_ROW_FRACTION * n or rows * n > solvers.DENSE_NEWTON_FLOATS:
        return None
    basis = row_basis([_scaled(a.value, s) for a, s in matrices.values()], n)
    if basis.shape[1] == 0 and n < DIAGONAL_MIN:    # a diagonal (no data, or all-zero data)
        return None
    return _Structure(Plan([diagonal], program.variables), direction, basis)


def _scaled(matrix, scale):
    """matrix · diag(s) (dense or sparse; s a `Constant` or 1.0)."""
    if isinstance(scale, float):
        return matrix
    s = np.asarray(scale.value, dtype=float)
    if hasattr(matrix, "toarray"):
        return matrix.multiply(s).tocsr() if np.ndim(matrix) == 2 else matrix.toarray().ravel() * s
    return np.asarray(matrix, dtype=float) * s


def row_basis(matrices: list, n: int) -> "Basis":
    """An orthonormal basis Q (n × r) of the span of the rows of `matrices` (dense or sparse,
    vectors as one row), r their numerical rank. Sparse rows R (m × n) keep Q = Rᵀ T implicit
    (T m × r from the eigendecomposition of the m × m Gram matrix R Rᵀ: O(nnz·m + m³), memory
    nnz + m r; the dense SVD was O(n m²) and n m floats, 4 s and 120 MB a client at n = 10⁵,
    m = 150); dense rows take the SVD as before. Directions of the Gram matrix below
    `GRAM_FLOOR` of its largest are dropped: their share of a Hessian is below the check's
    tolerance (a Hessian that still needs them fails `hessian`'s check: the dense path)."""
    if not matrices:
        return Basis(np.zeros((n, 0)))
    if all(hasattr(a, "toarray") and np.ndim(a) == 2 for a in matrices):
        import scipy.sparse as sp
        rows = sp.vstack([a.tocsr() for a in matrices]).tocsr()
        gram = (rows @ rows.T).toarray()
        values, vectors = np.linalg.eigh(0.5 * (gram + gram.T))
        if not values.size or not values[-1] > 0:
            return Basis(np.zeros((n, 0)))
        keep = values > values[-1] * GRAM_FLOOR
        return Basis(rows.T.tocsr(), vectors[:, keep] / np.sqrt(values[keep]))
    rows = np.vstack([np.reshape(a.toarray() if hasattr(a, "toarray") else np.asarray(a, float), (-1, n))
                      for a in matrices])
    Q, s, _ = np.linalg.svd(rows.T, full_matrices=False)
    if not s.size or not s[0] > 0:
        return Basis(np.zeros((n, 0)))
    return Basis(np.ascontiguousarray(Q[:, s > s[0] * max(rows.shape) * np.finfo(float).eps]))


class Basis:
    """Q = B T (n × r): B the data rows transposed (sparse, n × m) and T (m × r), or B = Q
    itself (dense, T None). Products with Q and Qᵀ go through B: O(nnz + m r) per vector."""

    __slots__ = ("rows", "mix", "shape")

    def __init__(self, rows, mix: "np.ndarray | None" = None):
        self.rows, self.mix = rows, mix
        self.shape = (rows.shape[0], rows.shape[1] if mix is None else mix.shape[1])

    def times(self, v: np.ndarray) -> np.ndarray:
        """Q v (v of r entries, or r × k)."""
        return self.rows @ (v if self.mix is None else self.mix @ v)

    def transpose_times(self, g: np.ndarray) -> np.ndarray:
        """Qᵀ g (g of n entries, or n × k)."""
        out = self.rows.T @ g
        return out if self.mix is None else self.mix.T @ out

    def columns(self, start: int, stop: int) -> np.ndarray:
        """Q[:, start:stop] as a dense array."""
        if self.mix is None:
            return self.rows[:, start:stop]
        return np.asarray(self.rows @ self.mix[:, start:stop])

    def weighted_gram(self, weight: np.ndarray) -> np.ndarray:
        """Qᵀ diag(weight) Q (r × r)."""
        if self.mix is None:
            return self.rows.T @ (weight[:, None] * self.rows)
        inner = self.rows.T @ self.rows.multiply(weight[:, None]).tocsr()
        inner = inner.toarray() if hasattr(inner, "toarray") else inner
        return self.mix.T @ inner @ self.mix

    def dense(self) -> np.ndarray:
        return self.columns(0, self.shape[1])


def hessian(program, z: np.ndarray) -> "np.ndarray | None":
    """∇²P_i(z) packed (`pack`) as diag(λ) + Q C Qᵀ (Q the program's `basis_of`), or None when
    the program has no such form (then, and from then on, the dense Hessian)."""
    found = structure(program)
    if found is None:
        return None
    n, Q = program.n_shared, found.basis
    r = Q.shape[1]
    lam = _diagonal(found, z, n)
    C = np.empty((r, r))
    block = max(1, HESSIAN_BLOCK_FLOATS // max(n, 1))   # (Q's columns dense a block at a time)
    check, hv = check_direction(n), None
    for start in range(0, r, block):
        V = Q.columns(start, min(start + block, r))
        last = start + block >= r and V.shape[1] < block      # (the check's direction rides on it)
        HV = _times(program, z, np.column_stack([V, check]) if last else V)
        if last:
            HV, hv = HV[:, :-1], HV[:, -1]
        C[:, start:start + V.shape[1]] = Q.transpose_times(HV - lam[:, None] * V)
    packed = pack(lam, 0.5 * (C + C.T))
    if not _matches(program, z, packed, hv):
        program._low_rank = None
        return None
    return packed


def _matches(program, z: np.ndarray, packed: np.ndarray, hv: np.ndarray | None = None) -> bool:
    """The check (module docstring): ∇²P_i(z) v = λ∘v + Q C Qᵀ v on a random direction v
    (`hv`: ∇²P_i(z) v when the caller had it from the batched product that made C — one
    Hessian-vector plan call less a Hessian)."""
    Q, n = basis_of(program), program.n_shared
    v = check_direction(n)
    lam, C = unpack(packed)
    hv = program.hvp(z, v) if hv is None else hv
    parts = (lam * v, Q.times(C @ Q.transpose_times(v)))
    scale = solvers.norm_inf(hv) + sum(solvers.norm_inf(p) for p in parts)
    return bool(solvers.norm_inf(hv - parts[0] - parts[1]) <= GUARD_TOL * scale)


def refreshed(program) -> "np.ndarray | None":
    """A quadratic program's kept packed Hessian after β or ω changed (`NodeProgram.
    _forget_hessian`): λ anew and C kept when the check passes at the new settings (a proximal
    weight changes λ only), else None (a fresh one on first use). One product instead of r:
    each outer iteration's refresh was ~0.27 s a client at d = 10⁵, 150 rows (a third of a
    ProxAL run). A function of the kept matrix and the settings: resumed nodes agree bitwise."""
    kept = program._hessian_cache
    found = structure(program) if kept is not None and kept.ndim == 1 else None
    if found is None:
        return None
    z = np.zeros(program.n_shared)
    candidate = pack(_diagonal(found, z, z.size), packed_core(kept).copy())
    return candidate if _matches(program, z, candidate) else None


def _diagonal(found: _Structure, z: np.ndarray, n: int) -> np.ndarray:
    """λ at z (module docstring): the Hessian-vector product along v = 1 with the data's
    products replaced by 0."""
    found.direction.value = np.ones(n)
    return np.array(np.broadcast_to(found.diagonal_plan(z)[0], (n,)), dtype=float)


def basis_of(program) -> Basis:
    """The basis Q of the program's packed Hessians (`structure` found)."""
    return structure(program).basis


def _times(program, z: np.ndarray, V: np.ndarray) -> np.ndarray:
    """∇²P_i(z) V (N × k) by the batched Hessian-vector plan, in blocks of directions as
    `CompiledMerit.hessian`'s (column by column without a batched plan)."""
    compiled, (n, k) = program.compiled, V.shape
    plan = compiled._hessian_plan
    if plan is not None and len(plan.batched_outputs) == 1 and plan.batched_outputs[0]:
        block = max(1, HESSIAN_BLOCK_FLOATS // max(plan.batched_size, 1))
        parts = [plan(z, V[:, s:s + block]) for s in range(0, k, block)]
        if all(len(p) == 1 and np.shape(p[0]) == (n, min(block, k - s))
               for p, s in zip(parts, range(0, k, block))):
            return np.hstack([p[0] for p in parts]) if parts else np.zeros((n, 0))
    return np.column_stack([compiled.hvp(z, V[:, j]) for j in range(k)]) if k else np.zeros((n, 0))


# ---- the packed form: [N, r, λ (N), C (r·r)]; Q is the program's (`basis_of`) -------------------
def pack(lam: np.ndarray, C: np.ndarray) -> np.ndarray:
    return np.concatenate([[lam.size, len(C)], lam, C.ravel()])


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(λ, C) of a packed Hessian (views)."""
    return packed[2:2 + int(packed[0])], packed_core(packed)


def packed_core(packed: np.ndarray) -> np.ndarray:
    n, r = int(packed[0]), int(packed[1])
    return packed[2 + n:].reshape(r, r)


def dense(packed: np.ndarray, basis: Basis) -> np.ndarray:
    """The N × N matrix diag(λ) + Q C Qᵀ of a packed Hessian."""
    lam, C = unpack(packed)
    Q = basis.dense()
    H = Q @ C @ Q.T
    H[np.diag_indices(lam.size)] += lam
    return 0.5 * (H + H.T)


class WoodburyInverse(solvers.Inverse):
    """(diag(λ + w) + Q C Qᵀ)⁻¹ of a packed Hessian and a weight w (module docstring), as
    `solvers.Inverse` (`matrix @ g`); None as matrix where I + C K is singular. Built only when
    λ + w > 0 (`inverse`)."""

    __slots__ = ()

    def __init__(self, packed: np.ndarray, basis: Basis, weight: np.ndarray):
        lam, C = unpack(packed)
        inv_d = 1.0 / (lam + weight)
        K = basis.weighted_gram(inv_d)
        try:
            core = np.linalg.solve(np.eye(len(C)) + C @ K, C)      # (I + C K)⁻¹ C
            self.matrix = _Woodbury(inv_d, basis, core) if np.all(np.isfinite(core)) else None
        except np.linalg.LinAlgError:
            self.matrix = None


def inverse(packed: np.ndarray, basis: Basis, weight: np.ndarray) -> "WoodburyInverse | None":
    """The Woodbury inverse of ∇²P_i + diag(weight), or None when some λ + w ≤ 0 (the caller
    inverts `dense(packed, basis)`)."""
    lam = unpack(packed)[0]
    return WoodburyInverse(packed, basis, weight) if np.all(lam + weight > 0) else None


class _Woodbury:
    """The operator D⁻¹ − D⁻¹ Q core Qᵀ D⁻¹ (`matrix @ g` as for an array)."""

    __slots__ = ("inv_d", "basis", "core")

    def __init__(self, inv_d: np.ndarray, basis: Basis, core: np.ndarray):
        self.inv_d, self.basis, self.core = inv_d, basis, core

    def __matmul__(self, g: np.ndarray) -> np.ndarray:
        a = self.inv_d * g
        if not self.core.size:
            return a
        return a - self.inv_d * self.basis.times(self.core @ self.basis.transpose_times(a))
