"""Every atom has a rule in every lowering target (issue 26): CVXPY, sympy (symbolic, explicit,
and the scalar formula its entry-wise rules forward to), numpy value and derivative, JAX,
batched, per-record and classification. A rule, or an explicit `not_applicable` entry that says
why the atom never reaches the target; an entry merely inherited from another concrete atom
(`Mean` of `Sum`) does not count. The second half checks that this test can fail."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import fedmodel as fm
import fedmodel.atoms
from fedmodel.atoms import Atom, Sum
from fedmodel.atoms.elementwise import Elementwise
from fedmodel.compiler.classify import DEGREE_RULES
from fedmodel.compiler.codegen import NUMPY_VALUE
from fedmodel.compiler.differentiate import DERIVATIVE_RULES
from fedmodel.compiler.directions import DIRECTION_RULES
from fedmodel.compiler.jax_rules import JAX_RULES
from fedmodel.compiler.per_record import RECORD_RULES
from fedmodel.lowering.rules import NotApplicable, RuleTable
from fedmodel.lowering.to_cvxpy import CVXPY_RULES
from fedmodel.lowering.sympy_explicit import EXPLICIT_RULES, _entry_by_entry
from fedmodel.lowering.sympy_forms import SCALAR_RULES
from fedmodel.lowering.to_sympy import SYMPY_RULES, _entrywise, _hadamard_power
from fedmodel.runtime.batched_rules import BATCHED_RULES

TARGETS: dict[str, RuleTable] = {table.name: table for table in (
    CVXPY_RULES, SYMPY_RULES, EXPLICIT_RULES, NUMPY_VALUE, DERIVATIVE_RULES, JAX_RULES,
    BATCHED_RULES, RECORD_RULES, DEGREE_RULES, DIRECTION_RULES)}


def concrete(kind: type) -> bool:
    """An atom a node can be (it names itself: `display`), not an abstract family."""
    return issubclass(kind, Atom) and kind is not Atom and "display" in vars(kind)


def atom_classes() -> list[type]:
    """Every concrete atom class defined in the modules of `fedmodel.atoms`."""
    found = {}
    for info in pkgutil.iter_modules(fedmodel.atoms.__path__):
        module = importlib.import_module(f"fedmodel.atoms.{info.name}")
        for _, kind in inspect.getmembers(module, inspect.isclass):
            if kind.__module__ == module.__name__ and concrete(kind):
                found[kind.__qualname__] = kind
    return sorted(found.values(), key=lambda k: k.__name__)


def _forwards_to_scalar(kind: type) -> bool:
    """Whether sympy's rule of `kind` applies the scalar formula (SCALAR_RULES) to entries."""
    return SYMPY_RULES.entry(kind)[1] in (_entrywise, _hadamard_power) \
        or EXPLICIT_RULES.entry(kind)[1] is _entry_by_entry


def missing_rules(kinds: list[type]) -> dict[str, list[str]]:
    """Per target, the atom classes of `kinds` without an entry of their own ("Class: why")."""
    report = {name: table.uncovered(kinds, concrete) for name, table in TARGETS.items()}
    report["sympy scalar"] = SCALAR_RULES.uncovered(
        [k for k in kinds if _forwards_to_scalar(k)], concrete)
    return {name: found for name, found in report.items() if found}


def test_the_atoms_are_found():
    """The enumeration sees every atom (the completeness test below is not vacuous)."""
    names = {k.__name__ for k in atom_classes()}
    assert len(names) >= 35
    assert {"Add", "Multiply", "MatMul", "Exp", "Logistic", "Sigmoid", "Step", "Sum", "Mean",
            "SumTo", "IndexAdjoint", "QuadForm", "LogSumExp", "Softmax", "ArgmaxAbs"} <= names
    assert not names & {"Atom", "Elementwise", "EntryMap", "Retarget", "Product", "Reduction",
                        "Norm", "AlongAxis", "_ZeroSlope"}


def test_every_atom_has_a_rule_in_every_target():
    assert missing_rules(atom_classes()) == {}


# ---- the test can fail ----------------------------------------------------------------------
class Unruled(Atom):
    """A new atom whose author wrote no rule anywhere."""
    display = "unruled"


class Total(Sum):
    """A new atom that subclasses a concrete one and registers nothing: every target would
    silently use the sum's rule for it."""
    display = "total"


class Cube(Elementwise):
    """A new entry-wise atom with its value and derivative only."""
    display = "cube"

    def numeric(self, x):
        return x ** 3

    def derivative(self, x):
        return fm.multiply(3.0, fm.square(x))


def test_an_atom_without_rules_is_reported_by_every_target():
    report = missing_rules([Unruled])
    # sympy's symbolic form renders any atom as a named function `unruled(x)` (its rule of Atom)
    assert set(report) == set(TARGETS) - {"sympy"}
    assert all(found == ["Unruled: no rule"] for found in report.values())


def test_a_subclass_of_a_concrete_atom_does_not_inherit_its_rules():
    report = missing_rules([Total])
    assert set(report) == set(TARGETS)
    assert report["jax"] == ["Total: only inherits the rule of Sum"]
    assert report["numpy value"] == ["Total: only inherits the rule of Sum"]


def test_a_new_elementwise_atom_lacks_only_its_own_formulas():
    """Family rules (batched entry-wise, per-record row-wise, sympy's entry-wise forms, the
    derivative from `derivative`) cover it; its CVXPY, JAX, scalar-sympy and degree rules are
    its own to write."""
    assert set(missing_rules([Cube])) == {"cvxpy", "jax", "sympy scalar", "classification"}


# ---- the entries ------------------------------------------------------------------------------
def test_not_applicable_raises_the_missing_rule_error():
    """CVXPY's derivative-only atoms are explicit entries, and lowering one still raises what a
    class without a rule raised before (a FedModelError that says why)."""
    _, entry = CVXPY_RULES.entry(fm.atoms.Sigmoid)
    assert isinstance(entry, NotApplicable) and "derived gradients" in entry.reason
    w = fm.Variable(2, name="w")
    with pytest.raises(fm.FedModelError, match="sigmoid has no CVXPY lowering"):
        fm.to_cvxpy(fm.atoms.Sigmoid(w))
    assert CVXPY_RULES.find(fm.atoms.Sigmoid(w)) is None


def test_numpy_rules_are_the_atoms_own_methods():
    """The numpy target finds each atom's `numeric` and `vjp`: a plan computes their numbers,
    and a node of a class without `numeric` fails when the plan is compiled."""
    from fedmodel.compiler.codegen import Plan
    w = fm.Variable(3, name="w")
    x = np.array([0.5, -1.0, 2.0])
    cube = Cube(w)
    assert NUMPY_VALUE.rule(cube).__self__ is cube
    value, gradient = Plan([fm.sum(cube), fm.grad(fm.sum(cube), w)], [w])(x)
    np.testing.assert_allclose(value, np.sum(x ** 3), rtol=1e-15)
    np.testing.assert_allclose(gradient, 3 * x ** 2, rtol=1e-15)
    with pytest.raises(fm.FedModelError, match="Unruled .* has no numpy value"):
        Plan([Unruled(w)], [w])
    with pytest.raises(NotImplementedError, match="unruled has no derivative rule"):
        fm.grad(fm.sum(Unruled(w)), w)


def test_fallbacks_for_an_atom_without_a_rule_are_unchanged():
    """Where a fallback is right for any atom, an atom without a rule keeps it: the batched
    plan runs it client by client (same numbers as each client's plan), classification calls
    it not polynomial, per-record gradients refuse it."""
    from fedmodel.compiler.classify import polynomial_degree
    from fedmodel.compiler.codegen import Plan
    from fedmodel.compiler.per_record import NotRecordSeparable, RecordGradients
    from fedmodel.runtime.batched_plan import BatchedPlan
    w = fm.Variable(3, name="w")
    assert polynomial_degree(fm.sum(Cube(w))) == float("inf")
    assert polynomial_degree(fm.sum(Cube(fm.Constant(np.ones(3))))) == 0
    plans = []
    for i in range(3):
        X = fm.Constant(np.arange(6.0).reshape(2, 3) + i)
        plans.append(Plan([fm.sum(Cube(X @ w))], [w]))
    batched = BatchedPlan(plans)
    assert batched.rules[1] == "Cube:elementwise"     # the Elementwise family's rule
    x = np.array([0.1, -0.2, 0.3])
    got = batched(np.tile(x, 3))[0]
    np.testing.assert_allclose(got, [p(x)[0] for p in plans], rtol=1e-14)

    class Odd(Atom):                # no rule in any table: client by client
        display = "odd"

        def numeric(self, x):
            return x - x ** 3
    plans = [Plan([fm.sum(Odd(fm.Constant(np.full(3, 1.0 + i)) * w))], [w]) for i in range(2)]
    batched = BatchedPlan(plans)
    assert batched.rules[1] == "Odd:loop"
    np.testing.assert_allclose(batched(np.tile(x, 2))[0], [p(x)[0] for p in plans], rtol=1e-14)
    data = fm.Data(np.ones((4, 3)), "c0", name="X")
    with pytest.raises(NotRecordSeparable):
        RecordGradients(fm.sum(Odd(data @ w)), [w], "client 0")
