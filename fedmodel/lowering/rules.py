"""Per-atom lowering rules: a table keyed by atom class, as CVXPY keeps its canonicalizations
beside the reductions rather than in the atoms. A lowering registers a rule per class and
finds a node's rule through the class MRO, so a subclass (`Mean` of `Sum`) inherits its
parent's rule unless it registers its own."""
from __future__ import annotations

from typing import Any, Callable

Rule = Callable[..., Any]     # rule(node, *lowered_args) -> the node lowered


class RuleTable:
    """Rules of one lowering; `missing(node)` builds the exception for a class without one."""

    def __init__(self, missing: Callable[[Any], Exception]):
        self._rules: dict[type, Rule] = {}
        self._missing = missing

    def register(self, *kinds: type) -> Callable[[Rule], Rule]:
        """Decorator: `@table.register(Exp, Log)` makes the function the rule of those classes."""
        def decorate(rule: Rule) -> Rule:
            for kind in kinds:
                self._rules[kind] = rule
            return rule
        return decorate

    def rule(self, node: Any) -> Rule:
        """The rule of `node`'s class or of its nearest base class that has one."""
        for kind in type(node).__mro__:
            rule = self._rules.get(kind)
            if rule is not None:
                return rule
        raise self._missing(node)

    def __call__(self, node: Any, *args: Any) -> Any:
        """`node` lowered, given its arguments lowered."""
        return self.rule(node)(node, *args)
