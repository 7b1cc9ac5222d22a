"""`fedmodel` command line (docs/api.md §7), run in-process through `fedmodel.cli.main`."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import builtin_models, cli

def tiny(n_clients: int = 3):
    """A tiny least-squares model with a local and a global constraint (for CLI tests)."""
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="tiny")
    for i in range(n_clients):
        client = prob.add_client(f"c{i}")
        X = client.data(rng.normal(size=(6, 3)), name=f"X{i}")
        y = client.data(rng.normal(size=6), name=f"y{i}")
        client.minimize(fm.sum_squares(X @ w - y))
        client.subject_to((fm.sum(X @ w) <= 1.0).named(f"local[{i}]"))
    prob.server.subject_to((fm.norm2(w) <= 1.0).named("ball"))
    prob.server.minimize(0.1 * fm.norm1(w))
    return prob, w


@pytest.fixture
def with_tiny(monkeypatch):
    monkeypatch.setitem(builtin_models.MODELS, "tiny", tiny)


def test_examples_lists_neyman_pearson(capsys):
    assert cli.main(["examples"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert any(line.startswith("neyman-pearson") and "Neyman-Pearson" in line for line in lines)


def test_run_prints_result_and_verification_table(capsys, with_tiny):
    assert cli.main(["run", "tiny", "--clients", "4", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "tiny: 4 clients, 3 shared parameters; backend auto" in out   # the default
    assert "proxal: converged" in out and "objective" in out and "KKT" in out
    assert "  auto           picked proxal: " in out
    assert "objective gap" in out and "solution distance" in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict")]
    assert len(verdict) == 1 and verdict[0].endswith(": OK")


def test_run_without_verify_prints_no_table(capsys, with_tiny):
    assert cli.main(["run", "tiny", "--backend", "cvxpy"]) == 0
    out = capsys.readouterr().out
    assert "cvxpy: converged" in out and "verdict" not in out


def test_run_bad_input_is_reported_not_dumped(capsys, with_tiny):
    assert cli.main(["run", "no-such-example"]) == 2
    assert "unknown example 'no-such-example'" in capsys.readouterr().err
    assert cli.main(["run", "tiny", "--backend", "no-such-backend"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'no-such-backend'" in err
    assert cli.main(["run", "tiny", "--backend", "proxal", "--topology", "no_such"]) == 2
    assert "unknown topology 'no_such'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "tiny", "--clients", "0"])
    assert exit_info.value.code == 2
    assert "at least 1 client" in capsys.readouterr().err


def test_reproduce_unknown_name(capsys):
    assert cli.main(["reproduce", "no-such-table"]) == 2
    err = capsys.readouterr().err
    assert "unknown reproduction 'no-such-table'" in err and "'table1'" in err and "'dp-mnist'" in err


def test_reproduction_names_are_the_documented_ones_and_their_modules_exist():
    import importlib
    from fedmodel.reproductions import REPRODUCTIONS, _MODULES
    assert sorted(REPRODUCTIONS) == sorted(["table1", "table2", "table4", "tableI", "tableII", "fig5",
                                            "insa-table1", "insa-table2", "dp-mnist",
                                            "dp-constrained", "dp-budget"])
    for module in _MODULES.values():             # imported lazily by `fedmodel reproduce`
        assert callable(importlib.import_module(module).run)


def test_reproduce_rejects_an_option_the_reproduction_does_not_take(capsys, tmp_path):
    assert cli.main(["reproduce", "table4", "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'table4' takes no option plot_dir" in err
    assert not any(tmp_path.iterdir())


def test_module_entry_point_runs():
    completed = subprocess.run([sys.executable, "-m", "fedmodel.cli", "examples"],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "neyman-pearson" in completed.stdout


def test_neyman_pearson_example_model():
    prob, w = builtin_models.neyman_pearson(n_clients=4)
    assert prob.name == "neyman-pearson"
    assert [c.name for c in prob.clients] == ["c0", "c1", "c2", "c3"]
    assert w.shape == (30,)
    assert [c.name for c in prob.constraints] == ["ball"] + [f"np[c{i}]" for i in range(4)]
    assert len(prob.server.terms) == 1                     # the ridge term
    for client in prob.clients:
        assert len(client.terms) == 1 and client.terms[0].data_owners() == {client.name}
    result = prob.solve("cvxpy")
    assert result.status == "converged"
    assert result.max_violation <= 1e-6
    assert result.certificate.stationarity <= 1e-4
    for client in prob.clients:            # each client's class-1 loss is at most the threshold
        assert client.constraints[0].lhs.value <= 0.2 + 1e-6


def test_run_default_example_with_verify(capsys):
    assert cli.main(["run", "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("neyman-pearson: 5 clients, 30 shared parameters; backend auto")
    assert "proxal: converged" in out and "objective gap" in out
    # auto picks ProxAL (with Newton steps: 30 × 30 matrices fit), with `run`'s ProxAL options
    assert "  auto           picked proxal: d = 30, 5 clients: a step's 14 dense d × d matrices fit the dense budget" in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict")]
    assert len(verdict) == 1 and verdict[0].endswith(": OK")
