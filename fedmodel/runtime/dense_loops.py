"""The numba-compiled loops behind `dense_blocks.DenseBlocks` (imported on first use, so that
`import fedmodel` does not load numba; module-level, so numba's on-disk cache finds them).
Bounds are not checked here: `DenseBlocks.__matmul__` checks the shapes."""
import numba

jit = numba.njit(cache=True, nogil=True)


@jit
def forward(X, owner, V, out):
    """out[r] = X[r] · V[owner[r]], the columns summed in order (as a CSR row); four rows at a
    time (four independent sums: 1.4× faster at d = 784, each row's sum unchanged)."""
    rows, d = X.shape
    r = 0
    while r + 4 <= rows:
        o0, o1, o2, o3 = owner[r], owner[r + 1], owner[r + 2], owner[r + 3]
        s0 = s1 = s2 = s3 = 0.0
        for j in range(d):
            s0 += X[r, j] * V[o0, j]
            s1 += X[r + 1, j] * V[o1, j]
            s2 += X[r + 2, j] * V[o2, j]
            s3 += X[r + 3, j] * V[o3, j]
        out[r], out[r + 1], out[r + 2], out[r + 3] = s0, s1, s2, s3
        r += 4
    while r < rows:
        o = owner[r]
        s = 0.0
        for j in range(d):
            s += X[r, j] * V[o, j]
        out[r] = s
        r += 1


@jit
def backward(X, owner, t, G):
    """G[i] = Σ_(rows r of client i, in order) t[r] X[r] (as a CSC product of diag(X_i)ᵀ)."""
    G[:] = 0.0
    for r in range(X.shape[0]):
        o = owner[r]
        tr = t[r]
        for j in range(X.shape[1]):
            G[o, j] += X[r, j] * tr
