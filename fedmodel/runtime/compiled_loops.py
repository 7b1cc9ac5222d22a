"""The numba-compiled loops behind `kernels` (imported by `kernels._compiled` on first use, so
that `import fedmodel` does not load numba), and the small compiled helpers (`pick`, `larger`,
`max_abs_diff`, `shrink`) that backends' own compiled loops call. Module-level functions, so
that numba's on-disk cache finds them again in the next process. Bounds are not checked here:
the wrappers in `kernels` check every shape and index."""
import numba


def cached_jit(**options):
    """`numba.njit(cache=True, nogil=True, **options)` where numba finds a writable place for its
    on-disk cache (beside the source, else NUMBA_CACHE_DIR or the user's cache folder), else the
    same without the cache: numba refuses `cache=True` at decoration when it has none (a
    read-only install run by a user without a home folder), and a missing cache must cost a
    compilation per process, not the run."""
    def decorate(fn):
        try:
            return numba.njit(cache=True, nogil=True, **options)(fn)
        except RuntimeError as error:
            if "cannot cache" not in str(error):
                raise
            return numba.njit(nogil=True, **options)(fn)
    return decorate


jit = cached_jit()


@jit
def pick(A, i):
    """Row i of an operand with n rows, or its only row."""
    return A[i] if A.shape[0] > 1 else A[0]


@jit
def larger(a, b):
    """max(a, b), NaN as soon as either is NaN (as np.max)."""
    return a if (a != a or a >= b) else b


@jit
def max_abs_diff(a, b):
    """max_c |a_c − b_c| as np.max computes it (NaN if any difference is NaN)."""
    largest, bad = 0.0, False
    for c in range(a.shape[0]):
        v = abs(a[c] - b[c])
        largest = max(largest, v)           # (faster than `larger`)
        bad |= v * 0.0 != 0.0               # an inf or NaN difference
    if bad:
        for c in range(a.shape[0]):
            largest = larger(largest, abs(a[c] - b[c]))
    return largest


@jit
def shrink(row, t, lo, hi):
    """row[lo:hi] ← row − clip(row, −t, t), in place (t < 0: nothing)."""
    if t >= 0.0:
        for c in range(lo, hi):
            z = row[c]
            clipped = -t if z < -t else z     # np.clip's order: max with −t, then min with t
            row[c] = z - (t if clipped > t else clipped)


@jit
def prox_grad_step(Z, G, weight, anchor, linear, sign, step, n_x, threshold, lo, hi, out):
    """out[i] ← Z[i] − α(G[i] + weight∘(Z[i] − anchor[i]) + sign·linear[i]) on the first n_x
    columns (the rest: Z − αG), then soft-thresholded."""
    wide = weight.shape[1] > 1
    for i in range(Z.shape[0]):
        z, g, a, l, w, o = Z[i], G[i], pick(anchor, i), pick(linear, i), pick(weight, i), out[i]
        if wide:
            for c in range(n_x):
                o[c] = z[c] - (((z[c] - a[c]) * w[c] + sign * l[c]) + g[c]) * step
        else:
            w0 = w[0]
            for c in range(n_x):
                o[c] = z[c] - (((z[c] - a[c]) * w0 + sign * l[c]) + g[c]) * step
        for c in range(n_x, Z.shape[1]):
            o[c] = z[c] - g[c] * step
        shrink(o, threshold[i], lo, hi)
