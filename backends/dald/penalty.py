"""Fed-DALD-CC's penalties: the rule that rescales the consensus weights ρ∘ρ (`PENALTY_RULE`,
`balance`; the spectral rule is `spectral`), the clients' constraint penalty β raised while their
violation fails to halve (`penalty_slow`, `raise_beta=True`), and the server's (`ServerPenalty`,
the default): the method of multipliers' rule for raising a penalty (Bertsekas 1982 §2.2; the
paper's Theorem 2 allows any increasing penalty schedule)."""
from __future__ import annotations

# residual balancing's band: ρ changes when one residual is BALANCE_RATIO times the other. Boyd
# et al. use 10; on bench_rounds' models 10 left 2ρ² ~10× above the balance (the dual residual
# 10–18× the primal for 150+ iterations) and 3 took ridge / logistic / lasso n = 5 from 151 /
# 192 / 86 iterations to 79 / 94 / 45 (with the stop test's D in the initial ρ's units)
BALANCE_RATIO = 3.0
# adaptive ρ's rule: "spectral" (`spectral.penalty`, Xu et al. 2017) or "balance" (`balance`).
# Balancing settled ρ∘ρ at 1/16 on bench_rounds' n = 40 models where a fixed 1/100 was 2.5×
# faster (it equalizes the residuals, which is not the fastest rate): ridge / logistic / lasso
# n = 40 took 112 / 148 / 112 iterations, the spectral rule 39 / 43 / 39 (n = 5: 61 / 92 / 45 →
# 34 / 49 / 33), every run verified against CVXPY
PENALTY_RULE = "spectral"


def balance(primal: float, dual: float, ratio: float = BALANCE_RATIO, factor: float = 2.0) -> float:
    """Residual balancing (Boyd et al. 2011, §3.4.1) for the weights 2ρ∘ρ: ×factor when the
    consensus residual is `ratio` times the dual residual 2ρ²‖Δx̂‖∞, ÷factor in the opposite case."""
    if primal > ratio * dual:
        return factor
    if dual > ratio * primal:
        return 1.0 / factor
    return 1.0


# `raise_beta=True`: the clients' constraint penalty β (`beta=None`) ×PENALTY_RAISE every PENALTY_EVERY outer
# steps while their violation (the records' constraint residual) fails to halve, up to PENALTY_CAP·β₀ (the
# method of multipliers' rule, Bertsekas 1982 §2.2). Not the default: NP adult n = 5 converges (without:
# cap, 0.22 away) and bench_verdicts' OK 18 → 25 of 36, but the flat NP model (tests/test_np_convergence.py)
# went from converged (754) to its cap (BENCHMARKS, branch dald784)
PENALTY_EVERY, PENALTY_RAISE, PENALTY_CAP = 10, 10.0, 1e4


def penalty_slow(history: list[dict], every: int = PENALTY_EVERY, floor: float = 0.0) -> bool:
    """Whether the clients' violation (`constraint_residual`) failed to halve over the last
    `every` records against the `every` before, while above `floor`.

    >>> penalty_slow([{"constraint_residual": 0.1}] * 4, every=2)
    True
    >>> penalty_slow([{"constraint_residual": r} for r in (0.1, 0.1, 0.04, 0.03)], every=2)
    False
    """
    if len(history) < 2 * every:
        return False
    before = min(h["constraint_residual"] for h in history[-2 * every:-every])
    recent = min(h["constraint_residual"] for h in history[-every:])
    return recent > floor and recent > 0.5 * before


# The server's constraint penalty β_s (its block's own constraints, held by the augmented Lagrangian of its
# exact step (14); β₀ = `DALD._beta()`) ×SERVER_RAISE after an outer step whose violation failed to halve
# over the last SERVER_EVERY steps (and since the last raise) while it stood above the tolerance and the
# consensus residual: the multiplier then grows by β_s·violation a step towards a solution's, which a
# strong objective beside the constraint makes large (a ridge λ‖w‖² against w0 + w1 = 2 needs ~2λ:
# at β₀ = 2 the violation sat at 0.48 for 40 steps, "stalled", at λ = 1e5). Up to SERVER_CAP·β₀: a
# model in units ×1e-3 (λ ×1e6 beside its loss) needed β_s ~1e14 (docs/BENCHMARKS.md, branch daldbeta)
SERVER_EVERY, SERVER_RAISE, SERVER_CAP = 2, 10.0, 1e16


class ServerPenalty:
    """β_s, the penalty of the server's own constraints, and the rule that raises it (above).
    `active`: whether it may rise (DALD's default β, multiplier steps (15), and a model whose
    constraints are sets with a common point, `feasible_by_its_sets`: there a violation that does
    not fall is a penalty too weak for the multiplier a solution needs, never an infeasible model,
    whose verdict the rule would delay). `state` / `restore`: what a checkpoint keeps."""

    def __init__(self, beta0: float, active: bool):
        self.beta0, self.beta, self.active = float(beta0), float(beta0), bool(active)
        self.seen: list[float] = []          # the server's violation after each outer step
        self.last = 0                        # the outer step of the last raise

    def read(self, dmu: float) -> float:
        """The server's multiplier step dmu = β_s·|c| of this outer step, kept as a violation
        and returned in β₀'s units (dmu/β₀ is what the stop test and the stall rule read)."""
        self.seen.append(dmu / self.beta)
        return dmu * self.beta0 / self.beta

    def slow(self, k: int, primal: float, floor: float) -> bool:
        """Whether to raise β_s after outer step k (`read` called for it), the consensus residual
        `primal`: the violation v_k above `floor` and `primal` and above half of v_(k−EVERY), at
        least SERVER_EVERY steps after the last raise, the cap not reached.

        >>> p = ServerPenalty(2.0, True)
        >>> [p.read(2.0 * v) for v in (0.5, 0.5, 0.5)] and p.slow(3, 1e-6, 1e-6)
        True
        >>> p.read(2.0 * 0.2) and p.slow(4, 1e-6, 1e-6)     # fell below half of v_2
        False
        """
        if not self.active or len(self.seen) <= SERVER_EVERY or k - self.last < SERVER_EVERY \
                or self.beta * SERVER_RAISE > self.beta0 * SERVER_CAP:
            return False
        now = self.seen[-1]
        return now > max(floor, primal) and now > 0.5 * self.seen[-1 - SERVER_EVERY]

    def raise_at(self, k: int) -> float:
        """β_s ×SERVER_RAISE after outer step k; the new β_s."""
        self.beta, self.last = self.beta * SERVER_RAISE, k
        return self.beta

    def state(self) -> tuple:
        return self.beta, self.last, self.seen[-SERVER_EVERY - 1:]

    def restore(self, saved: tuple | None) -> None:
        if saved is not None:
            self.beta, self.last, seen = saved
            self.seen = list(seen)
