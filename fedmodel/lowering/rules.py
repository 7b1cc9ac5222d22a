"""Per-atom lowering rules: a table keyed by atom class, as CVXPY keeps its canonicalizations
beside the reductions rather than in the atoms. A lowering registers a rule per class and
finds a node's rule through the class MRO, so a subclass (`Mean` of `Sum`) inherits its
parent's rule unless it registers its own.

Every lowering target has one table (CVXPY, sympy, numpy value and derivative, JAX, batched,
per-record, classification), and `tests/test_atom_rules.py` checks that each table has an entry
for every concrete atom class: a rule, or an explicit `not_applicable` entry that says why the
atom never reaches that target. `uncovered(kinds)` is that check, so adding an atom without its
rules fails a test instead of falling through an `isinstance` chain at run time.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

Rule = Callable[..., Any]     # rule(node, *lowered_args) -> the node lowered


class NotApplicable:
    """The entry of an atom class that never reaches a target; calling its rule raises the
    table's missing-rule error, as a class without any entry would."""

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"NotApplicable({self.reason!r})"


class RuleTable:
    """Rules of one lowering; `missing(node)` builds the exception for a class without one.
    `name` names the target (in tests/test_atom_rules.py's reports)."""

    def __init__(self, missing: Callable[[Any], Exception], name: str = ""):
        self._rules: dict[type, Rule | NotApplicable] = {}
        self._resolved: dict[type, tuple[type | None, Rule | NotApplicable | None]] = {}
        self._missing = missing
        self.name = name

    def register(self, *kinds: type) -> Callable[[Rule], Rule]:
        """Decorator: `@table.register(Exp, Log)` makes the function the rule of those classes."""
        def decorate(rule: Rule) -> Rule:
            for kind in kinds:
                self._rules[kind] = rule
            self._resolved.clear()
            return rule
        return decorate

    def not_applicable(self, *kinds: type, reason: str) -> None:
        """Mark `kinds` as atoms this target never lowers (say why in `reason`): an explicit
        entry for the completeness check; lowering one still raises the missing-rule error."""
        for kind in kinds:
            self._rules[kind] = NotApplicable(reason)
        self._resolved.clear()

    def entry(self, kind: type) -> tuple[type | None, Rule | NotApplicable | None]:
        """(the class whose entry `kind` uses, that entry) through the MRO; (None, None) when
        there is none. Cached per class (a plan of 10⁴ clients looks up a rule per step)."""
        found = self._resolved.get(kind)
        if found is None:
            found = self._resolved[kind] = self._find(kind)
        return found

    def _find(self, kind: type) -> tuple[type | None, Rule | NotApplicable | None]:
        return next(((base, self._rules[base]) for base in kind.__mro__ if base in self._rules),
                    (None, None))

    def find(self, node: Any) -> Rule | None:
        """`node`'s rule, or None without one (or with a `not_applicable` entry): for callers
        whose fallback is right for any atom (the batched plan's client-by-client loop)."""
        rule = self.entry(type(node))[1]
        return None if rule is None or isinstance(rule, NotApplicable) else rule

    def rule(self, node: Any) -> Rule:
        """The rule of `node`'s class or of its nearest base class that has one."""
        rule = self.entry(type(node))[1]
        if rule is None or isinstance(rule, NotApplicable):
            raise self._missing(node)
        return rule

    def __call__(self, node: Any, *args: Any) -> Any:
        """`node` lowered, given its arguments lowered."""
        return self.rule(node)(node, *args)

    def uncovered(self, kinds: Iterable[type], concrete: Callable[[type], bool]) -> list[str]:
        """Of the atom classes `kinds`, those without an entry of their own: no entry at all, or
        one inherited from another concrete class (`concrete(kind)`), as a new `Mean` of `Sum`
        would silently inherit the sum's rule. An entry of an abstract base (`Elementwise`)
        is a rule written for the whole family and counts. Each as "Class: why"."""
        out = []
        for kind in kinds:
            owner, rule = self.entry(kind)
            if rule is None:
                out.append(f"{kind.__name__}: no rule")
            elif owner is not kind and concrete(owner):
                out.append(f"{kind.__name__}: only inherits the rule of {owner.__name__}")
        return out


class MethodRules(RuleTable):
    """A target whose rules are methods of the atoms themselves (their numpy value, their
    derivative: the IR's single source of truth, DESIGN.md). `methods` lists (name, base):
    a class deriving from `base` has the rule when it overrides `base`'s `name`; the rule of a
    node is its bound `methods[0]` method. Entries of `not_applicable` work as in a RuleTable."""

    def __init__(self, missing: Callable[[Any], Exception], methods: list[tuple[str, type]],
                 name: str = ""):
        super().__init__(missing, name)
        self._methods = methods

    def _find(self, kind: type) -> tuple[type | None, Rule | NotApplicable | None]:
        owner, marked = super()._find(kind)
        if marked is not None:
            return owner, marked
        owner = None
        for method, base in self._methods:
            if not issubclass(kind, base):
                continue
            if getattr(kind, method) is getattr(base, method):
                return None, None
            # the most derived class defining one of the methods (an abstract family may
            # define one for all its members: Elementwise's vjp from each one's derivative)
            defining = next(c for c in kind.__mro__ if method in c.__dict__)
            owner = defining if owner is None or issubclass(defining, owner) else owner
        return (owner, getattr(kind, self._methods[0][0])) if owner is not None else (None, None)

    def rule(self, node: Any) -> Rule:
        """`node`'s bound method (its `numeric`, its `vjp`)."""
        super().rule(node)        # raises the missing-rule error for a class without one
        return getattr(node, self._methods[0][0])

    def __call__(self, node: Any, *args: Any) -> Any:
        return self.rule(node)(*args)
