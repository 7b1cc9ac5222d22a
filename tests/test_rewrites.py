"""Property tests (hypothesis): a model written in equivalent ways is the same model.

Random small models (least squares or logistic, an ℓ1 term, a ridge on the server, a client
norm ball, a private epigraph variable per client) are written several ways a user would:
terms grouped in one `minimize` or spread over several, in another order, scaled
(`2 * (f / 2 + g / 2)`), written centrally (`prob.minimize`), with the same private name in
every client, with the rows split differently over the clients, on another topology. Every
applicable backend, run with its default options, must report "converged" and agree with
CVXPY's centralized solve; equivalent rewrites must give the same answer. A model with no
feasible point must be reported as such, never returned as an answer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedmodel as fm
from fedmodel import topologies

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOL = 2e-3          # ‖x − x*‖∞ / max(1, ‖x*‖∞) for a default federated run against CVXPY
# Each property runs twice: FAST_EXAMPLES examples in the fast suite, all of SETTINGS'
# max_examples in CI's integration run (derandomized: the same first examples in both)
FAST_EXAMPLES = 1


def _sized(check, **strategies):
    """`check` as two tests: (fast, integration), given `strategies`."""
    fast = settings(SETTINGS, max_examples=FAST_EXAMPLES)(given(**strategies)(check))
    full = pytest.mark.integration(SETTINGS(given(**strategies)(check)))
    return fast, full


@dataclass(frozen=True)
class Spec:
    """A random model: rows of (A, b) over `n` clients; which terms it has."""

    d: int
    n: int
    seed: int
    loss: str            # "ls" | "logistic"
    lam: float           # weight of λ‖w‖₁ on every client (0: none)
    ridge: float         # server (ridge/2)‖w‖² (> 0: logistic data can be separable, and a model
                         # without a minimizer has no answer to agree on)
    ball: float | None   # client constraint ‖w‖₂ ≤ ball
    private: bool        # each client: min … + 0.1·s, s ≥ ‖w‖² − 1, s ≥ 0 (private s)

    def data(self, split_seed: int | None = None):
        rng = np.random.default_rng(self.seed)
        rows = 8 * self.n
        A = rng.normal(size=(rows, self.d))
        truth = rng.normal(size=self.d)
        if self.loss == "ls":
            b = A @ truth + 0.1 * rng.normal(size=rows)
        else:
            b = np.where(A @ truth + 0.5 * rng.normal(size=rows) > 0, 1.0, -1.0)
        order = np.arange(rows) if split_seed is None else np.random.default_rng(split_seed).permutation(rows)
        cuts = np.array_split(order, self.n)
        return [(A[idx], b[idx]) for idx in cuts], rows


specs = st.builds(
    Spec, d=st.integers(2, 4), n=st.integers(2, 4), seed=st.integers(0, 10_000),
    loss=st.sampled_from(["ls", "logistic"]), lam=st.sampled_from([0.0, 0.05]),
    ridge=st.sampled_from([0.05, 0.2]), ball=st.sampled_from([None, 0.5]),
    private=st.booleans())


def build(spec: Spec, style: str = "split", same_names: bool = True, split_seed: int | None = None):
    """The model of `spec` written in `style`: "split" (one `minimize` per term), "one" (one
    `minimize(f + g + …)`), "reversed" (one `minimize`, terms in reverse order), "scaled"
    (`2 * (f / 2 + g / 2 + …)`), "central" (`prob.minimize` / `prob.subject_to` of the whole
    model, split by the compiler)."""
    parts, rows = spec.data(split_seed)
    w = fm.Variable(spec.d, name="w")
    prob = fm.Problem()
    central_terms, central_constraints = [], []
    for i, (A_i, b_i) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        A, b = c.data(A_i, name="A"), c.data(b_i, name="b")
        if spec.loss == "ls":
            loss = fm.sum_squares(A @ w - b) / rows
        else:
            loss = fm.sum(fm.logistic(-fm.multiply(b, A @ w))) / rows
        terms = [loss]
        constraints = []
        if spec.lam:
            terms.append(spec.lam * fm.norm1(w))
        if spec.private:
            s = c.variable((), name="s" if same_names else f"s{i}")
            terms.append(0.1 * s)
            constraints += [s >= fm.sum_squares(w) - 1.0, s >= 0]
        if spec.ball is not None:
            constraints.append(fm.norm2(w) <= spec.ball)
        if style == "central":
            central_terms += terms
            central_constraints += constraints
            continue
        if style == "split":
            for term in terms:
                c.minimize(term)
        elif style == "one":
            c.minimize(_sum(terms))
        elif style == "reversed":
            c.minimize(_sum(terms[::-1]))
        elif style == "scaled":
            c.minimize(2 * _sum([t / 2 for t in terms]))
        else:
            raise ValueError(style)
        c.subject_to(*constraints)
    if style == "central":
        prob.minimize(_sum(central_terms))
        prob.subject_to(*central_constraints)
    if spec.ridge:
        prob.server.minimize(0.5 * spec.ridge * fm.sum_squares(w))
    return prob, w


def _sum(terms):
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _distance(res, ref, w, w_ref=None) -> float:
    """‖x − x*‖∞ / max(1, ‖x*‖∞) for `w` in `res` and `w_ref` (default `w`) in `ref`."""
    x_star = ref.value(w if w_ref is None else w_ref)
    return float(np.max(np.abs(res.value(w) - x_star)) / max(1.0, np.max(np.abs(x_star))))


def _backends(spec: Spec) -> list[tuple[str, dict]]:
    """The backends whose model class contains `spec`, with the topology they run on."""
    out = [("proxal", {})]
    if not spec.private:
        out += [("dald", {}), ("dald", {"topology": "ring"})]
    if not spec.private and spec.ball is None and not spec.lam:
        out.append(("fedadmm", {}))
    return out


def _solve(prob, name: str, options: dict):
    options = dict(options)
    if options.pop("topology", None) == "ring":
        options["topology"] = topologies.ring(prob)
    return prob.solve(name, **options)


# ---- equivalent rewrites ----------------------------------------------------------------------
def _check_rewrites_solve_to_the_same_answer(spec, style):
    """CVXPY and ProxAL on a rewrite give what they give on the plain model."""
    plain, w = build(spec, "split")
    other, v = build(spec, style)
    ref_plain, ref_other = plain.solve("cvxpy"), other.solve("cvxpy")
    assert ref_plain.status == ref_other.status == "converged"
    assert np.max(np.abs(ref_other.value(v) - ref_plain.value(w))) <= 1e-4    # interior-point tolerance
    assert ref_other.objective == pytest.approx(ref_plain.objective, rel=1e-6, abs=1e-9)
    fed_plain, fed_other = plain.solve("proxal"), other.solve("proxal")
    assert fed_plain.status == fed_other.status == "converged"
    assert _distance(fed_plain, ref_plain, w) <= TOL
    assert _distance(fed_other, ref_plain, v, w) <= TOL
    if style != "central":
        # the compiler sees one canonical model: the same run up to round-off. (Written
        # centrally, λ‖w‖₁ reads no client data and goes to the server: another federated
        # split of the same model, which agrees with CVXPY, not bit for bit with the clients'.)
        assert np.max(np.abs(fed_other.value(v) - fed_plain.value(w))) <= 1e-8


(test_rewrites_solve_to_the_same_answer,
 test_rewrites_solve_to_the_same_answer_all_examples) = _sized(
    _check_rewrites_solve_to_the_same_answer, spec=specs,
    style=st.sampled_from(["one", "reversed", "scaled", "central"]))


def _check_every_applicable_backend_agrees_with_cvxpy(spec):
    """Default options, the model as a user writes it (one `minimize`, same private names)."""
    prob, w = build(spec, "one")
    ref = prob.solve("cvxpy")
    assert ref.status == "converged"
    for name, options in _backends(spec):
        res = _solve(prob, name, options)
        assert res.status == "converged", (name, options, res.status, res.info)
        assert _distance(res, ref, w) <= TOL, (name, options)
        assert res.max_violation <= 1e-3, (name, options)


(test_every_applicable_backend_agrees_with_cvxpy,
 test_every_applicable_backend_agrees_with_cvxpy_all_examples) = _sized(
    _check_every_applicable_backend_agrees_with_cvxpy, spec=specs)


def _check_the_same_data_split_differently_is_the_same_model(spec, split_seed):
    prob, w = build(spec, "one")
    other, v = build(spec, "one", split_seed=split_seed)
    ref, ref_other = prob.solve("cvxpy"), other.solve("cvxpy")
    assert np.max(np.abs(ref_other.value(v) - ref.value(w))) <= 1e-5
    res = other.solve("proxal")
    assert res.status == "converged"
    assert _distance(res, ref, v, w) <= TOL


(test_the_same_data_split_differently_is_the_same_model,
 test_the_same_data_split_differently_is_the_same_model_all_examples) = _sized(
    _check_the_same_data_split_differently_is_the_same_model, spec=specs, split_seed=st.integers(0, 1000))


def _check_duplicate_private_names_are_the_clients_business(spec):
    same, w = build(spec, "one", same_names=True)
    distinct, v = build(spec, "one", same_names=False)
    for backend in ("cvxpy", "proxal"):
        a, b = same.solve(backend), distinct.solve(backend)
        assert a.status == b.status == "converged"
        assert np.max(np.abs(a.value(w) - b.value(v))) <= 1e-6
        private_a = [a.value(var) for var in same.variables() if var.owner is not None]
        private_b = [b.value(var) for var in distinct.variables() if var.owner is not None]
        assert len(private_a) == spec.n
        np.testing.assert_allclose(private_a, private_b, atol=1e-6)


(test_duplicate_private_names_are_the_clients_business,
 test_duplicate_private_names_are_the_clients_business_all_examples) = _sized(
    _check_duplicate_private_names_are_the_clients_business, spec=specs.filter(lambda s: s.private))


# ---- what must be reported, never returned as an answer -----------------------------------------
def _check_an_infeasible_model_is_reported(spec):
    """Contradictory server constraints on top of a random model: no backend may call it converged."""
    prob, w = build(spec, "one")
    prob.server.subject_to((fm.sum(w) >= 1.0).named("at_least"), (fm.sum(w) <= -1.0).named("at_most"))
    ref = prob.solve("cvxpy")
    assert ref.status == "infeasible"
    with pytest.warns(RuntimeWarning, match="infeasible"):
        res = prob.solve("proxal")
    assert res.status == "infeasible"
    assert fm.verify(res, ref).ok            # both say infeasible: they agree


(test_an_infeasible_model_is_reported,
 test_an_infeasible_model_is_reported_all_examples) = _sized(
    _check_an_infeasible_model_is_reported, spec=specs.filter(lambda s: not s.private))


def _check_a_diverging_setting_is_reported(spec):
    """Local gradient steps far beyond 2/L (the paper's FedADMM, no safeguard): "diverged",
    with a warning that names the setting — never an answer."""
    from fedmodel import backends
    prob, _ = build(spec, "one")
    with pytest.warns(RuntimeWarning, match="diverged"):
        res = prob.solve(backends.FedADMM.paper(lr=100.0))
    assert res.status == "diverged" and "lr" in res.info["diverged"]


(test_a_diverging_setting_is_reported,
 test_a_diverging_setting_is_reported_all_examples) = _sized(
    _check_a_diverging_setting_is_reported,
    spec=specs.filter(lambda s: not s.private and s.ball is None and not s.lam))
