"""Data and model spellings as new users bring them (issue 25): lists of expressions summed as
CVXPY sums them, dates, masked arrays and sparse label columns given as client data. Independent
answers: closed forms (the minimizer of Σ‖w − aᵢ‖² is the mean of the aᵢ) and the same model
with the data given as a plain float array."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.problem import make_backend


def test_sum_of_a_list_of_client_terms_is_their_sum():
    """`prob.minimize(fm.sum([term_i ...]))`, CVXPY's spelling, minimizes Σᵢ ‖w − aᵢ‖²: its
    minimizer is the mean of the aᵢ (was a DataError 'constant is not numeric')."""
    anchors = np.array([[0.0, 1.0], [1.0, 3.0], [5.0, -1.0]])
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    terms = [fm.sum_squares(w - prob.add_client().data(a, name="a")) for a in anchors]
    prob.minimize(fm.sum(terms))
    res = prob.solve("cvxpy")
    np.testing.assert_allclose(res.value(w), anchors.mean(axis=0), atol=1e-6)
    assert res.objective == pytest.approx(((anchors - anchors.mean(axis=0)) ** 2).sum(), rel=1e-6)


def test_sum_of_a_list_of_vectors_adds_them_entrywise():
    w = fm.Variable(3, name="w")
    w.value = np.array([1.0, -2.0, 4.0])
    total = fm.sum([w, 2 * w, np.ones(3)])
    assert total.shape == (3,)
    np.testing.assert_allclose(total.value, 3 * w.value + 1)


@pytest.mark.parametrize("call, says", [(lambda t: fm.sum(t, axis=0), "item by item"),
                                        (lambda t: fm.mean(t), "one expression")])
def test_a_list_of_expressions_where_one_is_meant_says_how_to_write_it(call, says):
    w = fm.Variable(2, name="w")
    with pytest.raises(fm.FedModelError, match=says):
        call([fm.sum_squares(w), fm.norm1(w)])


@pytest.mark.parametrize("values", [
    np.array(["2020-01-01", "2020-03-01"] * 3, dtype="datetime64[D]").reshape(3, 2),
    np.arange(6).astype("timedelta64[s]").reshape(3, 2)])
def test_dates_as_client_data_are_a_data_error(values):
    """numpy would cast dates to day counts silently (the model then fits 'days since 1970')."""
    with pytest.raises(fm.DataError, match="dates or durations"):
        fm.Problem().add_client().data(values, name="X")


def test_a_masked_array_is_a_data_error_not_its_hidden_values():
    """np.asarray drops the mask: the masked entries' placeholder values would be fitted."""
    X = np.ma.masked_array(np.ones((4, 2)), mask=[[0, 1], [0, 0], [0, 0], [1, 0]])
    with pytest.raises(fm.DataError, match="2 masked"):
        fm.Problem().add_client().data(X, name="X")
    unmasked = fm.Problem().add_client().data(np.ma.masked_array(np.ones((4, 2))), name="X")
    assert unmasked.shape == (4, 2)


def test_a_sparse_label_column_solves_as_the_dense_column():
    """y as a sparse (m, 1) column in `X @ w - y` broadcasts as numpy's dense (m, 1) column
    (was a bare numpy broadcasting ValueError at solve time)."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(6, 2)), rng.normal(size=(6, 1))

    def solve(labels):
        w = fm.Variable(2, name="w")
        prob = fm.Problem()
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(labels, name="y")))
        prob.server.minimize(fm.sum_squares(w))
        res = prob.solve("cvxpy")
        return res.objective, res.value(w)

    dense, sparse = solve(y), solve(sp.coo_matrix(y))
    assert sparse[0] == pytest.approx(dense[0], rel=1e-8)
    np.testing.assert_allclose(sparse[1], dense[1], atol=1e-8)


# ---- partitioners and loaders, as users call them --------------------------------------------
def test_partitioner_arguments_are_data_errors_that_name_the_argument():
    """ratio=0 crashed with numpy's 'slice step cannot be zero'; classes_per_client=0 was
    reported as 'n_clients must be a positive integer, got 0'; too many shards as '20 clients'."""
    from fedmodel import partitioners
    y = np.array([0, 0, 1, 1, 1, 0])
    with pytest.raises(fm.DataError, match="ratio must be a positive integer"):
        partitioners.strided_split(y, 2, ratio=0)
    with pytest.raises(fm.DataError, match="classes_per_client must be a positive integer"):
        partitioners.label_skew_split(y, 2, classes_per_client=0)
    with pytest.raises(fm.DataError, match=r"20 shards \(5 clients × 4\)"):
        partitioners.label_skew_split(y, 5, classes_per_client=4)
    assert sorted(np.concatenate(partitioners.label_skew_split(y, 3, 2))) == list(range(6))


def test_an_mnist_split_that_does_not_exist_is_not_read_as_the_test_set():
    from fedmodel import datasets
    with pytest.raises(fm.DataError, match="'train' and 'test', not 'validation'"):
        datasets.load_mnist("validation", root="/nonexistent")


# ---- atoms at their kinks, verify's arguments ---------------------------------------------------
@pytest.mark.parametrize("shape", [2, (2, 2)])
def test_a_norm_that_is_zero_at_the_optimum_solves(shape):
    """min ‖W − A‖₂ is 0 at W = A: the certificate's derivative of the norm there divided a
    Python float by 0 (ZeroDivisionError out of prob.solve('cvxpy'))."""
    A = np.ones(shape)
    W = fm.Variable(shape, name="W")
    prob = fm.Problem()
    prob.add_client().minimize(fm.norm2(W - A))
    res = prob.solve("cvxpy")
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(W), A, atol=1e-6 * np.abs(A).max())


def test_verify_says_what_it_takes():
    """verify(problem), verify(None), a reference named by string and a non-positive rtol were
    AttributeErrors or a silent NOT OK."""
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w - 1))
    res = prob.solve("cvxpy")
    with pytest.raises(fm.FedModelError, match="solve it first"):
        fm.verify(prob)
    with pytest.raises(fm.FedModelError, match="got NoneType"):
        fm.verify(None)
    with pytest.raises(fm.FedModelError, match="leave reference out"):
        fm.verify(res, "cvxpy")
    for rtol in (0, -1e-3, float("nan")):
        with pytest.raises(fm.FedModelError, match="rtol must be a positive number"):
            fm.verify(res, res, rtol=rtol)
    assert fm.verify(res, res, rtol=1e-6).ok


@pytest.mark.parametrize("weight", ["2", b"2"])
def test_a_client_weight_given_as_text_is_an_error(weight):
    with pytest.raises(fm.FedModelError, match="weight of client 'c0' must be a positive number"):
        fm.Problem().add_client(weight=weight)
    assert fm.Problem().add_client(weight=np.float32(2.0)).weight == 2.0


# ---- left by the shapes branch, fixed after its merge -------------------------------------
@pytest.mark.parametrize("make", [lambda: fm.Variable(3.0), lambda: fm.Parameter(2.0),
                                  lambda: fm.Variable("a")])
def test_a_shape_that_is_not_ints_is_a_shape_error(make):
    with pytest.raises(fm.errors.ShapeError, match="positive int"):   # was TypeError / ValueError
        make()


@pytest.mark.parametrize("compare", [lambda w: w < 1, lambda w: w > 1, lambda w: np.ones(3) < w])
def test_strict_inequalities_are_refused_as_in_cvxpy(compare):
    with pytest.raises(fm.errors.FedModelError, match="strict inequalities"):
        compare(fm.Variable(3, name="w"))                   # was TypeError "'<' not supported"


@pytest.mark.parametrize("backend", ["dald", "fedadmm"])
def test_a_stop_off_the_objectives_domain_is_not_converged(backend):
    # −Σ log w + Σ w, optimum w = 1: both stopped at w = 0 and said "converged", objective inf
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    for i in range(2):
        prob.add_client(f"c{i}").minimize(-fm.sum(fm.log(w)) + fm.sum(w))
    with pytest.raises(fm.FedModelError, match="set w.value"):   # refused before the run now
        prob.solve(backend)
    with pytest.warns(RuntimeWarning, match="outside its domain"):  # the run's own guard
        result = make_backend(backend).solve(prob)
    assert result.status != "converged" and not fm.verify(result).ok
