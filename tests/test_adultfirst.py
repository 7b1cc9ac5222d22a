"""NP adult's first solve (issue 27 item 3, branch adultfirst): the Gram Hessian at small d with
its check in the weights' own pass, its analysis re-bound across the clients of one structure
and kept across the solves of a kept program, and a client's phase one (fewer Hessians, its
merit's plans shared). Every Hessian is compared with today's path (the batched plan on the unit
directions, the form switched off) to 1e-12 relative.
"""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import gram_hessian, own_constraints
from fedmodel.runtime.program import compile_programs
from test_gram_hessian import _agrees, _today


def _np_model(n=3, m=400, d=14, seed=0, same=None):
    """NP-like clients: a mean logistic loss on one matrix A, a bound on the mean logistic loss
    on a second one B (its AL term: a Gram term and a rank-one pair). `same`: the client whose B
    has A's values (another array)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(n):
        X = rng.standard_normal((m, d)) + 1.0       # (shifted: the bound can be met)
        c = prob.add_client(f"c{i}")
        A = c.data(X, name=f"A{i}")
        B = c.data(X.copy() if i == same else rng.standard_normal((m // 2, d)) + 1.0, name=f"B{i}")
        c.minimize(fm.mean(fm.logistic(A @ w)))
        c.subject_to(fm.mean(fm.logistic(-(B @ w))) <= 0.5)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, rng


def _configured(prob, rng, d=14):
    programs = compile_programs(prob)
    for name, p in programs.items():
        if name != "server":
            p.configure(7.0, 0.1, rng.standard_normal(d))
            p.compiled.set_parameters(multipliers={k: np.full(np.shape(v.value), 0.3)
                                                   for k, v in p.compiled.ir.multipliers.items()})
    return programs


def test_d14_takes_the_gram_form_and_its_fused_check_still_refuses_a_misread(monkeypatch):
    """d = 14 (NP adult's) with the default thresholds: the form (it was below MIN_COLUMNS = 64),
    today's Hessian to round-off; a form that leaves its data terms out fails the check (now the
    plan's last output) and is dropped."""
    prob, rng = _np_model(n=1)
    program = _configured(prob, rng)["c0"]
    z = rng.standard_normal(14)
    H = program.hessian(z)
    found = gram_hessian.structure(program.compiled)
    assert found is not None and len([t for t in found.terms if t.source is not None]) == 2
    _agrees(H, _today(program, z))
    program.compiled.__dict__.pop("_gram")
    monkeypatch.setattr(gram_hessian, "_add_term", lambda term, outputs, upper, M, n, fresh: M)
    H = program.hessian(z)
    assert program.compiled._gram is None
    np.testing.assert_array_equal(H, _today(program, z))


def test_the_clients_of_one_structure_rebind_the_first_ones_form(monkeypatch):
    """One analysis for three clients of one structure (the others re-bound: ~0.2 against 1.2 ms
    at NP adult), each Hessian today's on its own data."""
    analysed = []
    original = gram_hessian._analyse
    monkeypatch.setattr(gram_hessian, "_analyse", lambda c: analysed.append(c.name) or original(c))
    prob, rng = _np_model()
    programs = _configured(prob, rng)
    for name in ("c0", "c1", "c2"):
        z = rng.standard_normal(14)
        H = programs[name].hessian(z)
        assert gram_hessian.structure(programs[name].compiled) is not None
        _agrees(H, _today(programs[name], z))
    assert analysed == ["c0"]


def test_a_reading_that_read_values_equal_is_not_rebound_where_they_differ(monkeypatch):
    """c0's B has A's values (another array): its reading takes one product for both terms.
    c1's differ: the re-binding checks the equal values again and c1 is analysed on its own
    (two products), its Hessian today's."""
    analysed = []
    original = gram_hessian._analyse
    monkeypatch.setattr(gram_hessian, "_analyse", lambda c: analysed.append(c.name) or original(c))
    prob, rng = _np_model(n=2, same=0)
    programs = _configured(prob, rng)
    z = rng.standard_normal(14)
    for name, data_terms in (("c0", 1), ("c1", 2)):
        H = programs[name].hessian(z)
        found = gram_hessian.structure(programs[name].compiled)
        assert len([t for t in found.terms if t.source is not None]) == data_terms
        _agrees(H, _today(programs[name], z))
    assert gram_hessian.structure(programs["c0"].compiled).equal
    assert analysed == ["c0", "c1"]


@pytest.mark.integration     # (~1.5 s: two solves)
def test_a_kept_program_keeps_its_analysis_and_lets_its_rows_go(monkeypatch):
    """Between two solves of one Problem the kept programs hold their Gram form without its rows
    (a copy of the client's data); the second solve analyses and re-binds nothing for the
    clients, and its answer is the first's."""
    prob, _ = _np_model(n=3, m=600)
    first = prob.solve()
    cache = prob.__dict__["_solve_cache"]
    programs = [p for kept in cache.programs.values() for name, p in kept.items() if name != "server"]
    forms = [p.compiled.__dict__.get("_gram") for p in programs]
    assert forms and all(isinstance(f, gram_hessian.Structure) for f in forms)
    assert all(t.rows is None for f in forms for t in f.terms)
    seen = []
    for name in ("_analyse", "_rebound"):
        original = getattr(gram_hessian, name)
        monkeypatch.setattr(gram_hessian, name, lambda c, o=original: seen.append(c.name) or o(c))
    second = prob.solve()
    assert [name for name in seen if name != "server"] == []
    assert second.status == first.status == "converged"
    assert second.objective == first.objective


def _phase_one_clients(feasible: bool):
    """Two clients whose own constraint is NP's, class-1 loss ≤ 0.2 on rows shifted by 1
    (feasible: today's phase one takes 2 Hessians a client to F = 0) or by 0.5 (infeasible:
    relative least violation ~0.2, 7 Hessians)."""
    rng = np.random.default_rng(3)
    w = fm.Variable(6, name="w")
    prob = fm.Problem()
    for i in range(2):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((300, 6)), name=f"X{i}") @ w)))
        A = rng.standard_normal((150, 6)) + (1.0 if feasible else 0.5)
        c.subject_to(fm.mean(fm.logistic(-(c.data(A, name=f"Y{i}") @ w))) <= 0.2)
    return compile_programs(prob)


def _replies(feasible: bool, trial: bool):
    """The two clients' replies, the phase-one Hessians they took, and their programs."""
    from fedmodel.runtime.compiled_merit import CompiledMerit
    counted = []
    original = CompiledMerit.hessian
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CompiledMerit, "hessian", lambda self, z: counted.append(1) or original(self, z))
        if not trial:
            patch.setattr(own_constraints, "_past_the_root", lambda *a: None)
        programs = _phase_one_clients(feasible)
        replies = [own_constraints.own_feasibility(programs[f"c{i}"]) for i in range(2)]
    return replies, len(counted), programs


def test_phase_one_stops_past_the_root_and_an_infeasible_reply_is_unchanged():
    """A feasible client's phase one finds F = 0 with fewer Hessians (the trial twice past the
    tangent's root); an infeasible client's steps never take it: its reply is bit for bit the
    one without the trial. The second client's phase-one merit re-binds the first one's plans."""
    feasible, fewer, programs = _replies(True, True)
    reference, more, _ = _replies(True, False)
    assert feasible == reference == [{"violation": 0.0, "constraint": ""}] * 2
    assert (fewer, more) == (2, 4)
    assert own_constraints._TEMPLATES[programs["c0"]]._share.family.rebound > 0
    infeasible, _, _ = _replies(False, True)
    reference, _, _ = _replies(False, False)
    assert infeasible == reference and all(r["violation"] > 0.1 for r in infeasible)
