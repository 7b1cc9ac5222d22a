"""Compiler pass: split a model written as if centralized into blocks by data owner.

Every objective term and constraint goes to the block whose data it reads (a client's data →
that client; server data or none → the server). A constraint that sums terms owned by several
parties, `Σ_i c̃_i(w; Z_i) ≤ 0` (paper 1, eq. 3), is decoupled into local constraints
`c̃_i(w; Z_i) ≤ s_i` and one global constraint `Σ_i s_i ≤ 0` on the server (eq. 4); the slacks
s_i join the shared variables.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from ..atoms import add
from ..constraints import Constraint, Equality, Inequality
from ..errors import FedModelError
from ..expression import Data, Expression, Variable
from .canonical import flatten

SERVER = "server"


class OwnedBlock(Protocol):
    """A block of the model, as the pass uses it: it takes objective terms and constraints."""

    def minimize(self, expr: Expression) -> None: ...

    def subject_to(self, *constraints: Constraint) -> None: ...


class SplitTarget(Protocol):
    """What the pass needs of the model it fills (a `fedmodel.problem.Problem`, which sits above
    the compiler and is not imported here): its blocks by owner name, problem-wide constraint
    names and the list of slack variables."""

    def block(self, name: str) -> OwnedBlock: ...

    def fresh_constraint_name(self, owner: str) -> str: ...

    def check_constraint_name(self, name: str, owner: str) -> None: ...

    def add_slack(self, slack: Variable) -> None: ...


def linear_terms(expr: Expression) -> list[Expression]:
    """Terms whose sum is `expr`: the canonical flattening (`canonical.flatten`: +, −, scalar
    multiples and divisions, sums of sums, broadcasts), each term as one expression."""
    return [term.expression() for term in flatten(expr)]


def owners_of(expr: Expression) -> set[str]:
    """Blocks whose private things (data, private variables) `expr` reads."""
    owners = set(expr.data_owners())
    owners |= {v.owner for v in expr.variables() if v.owner is not None}
    return owners


def owner_of_term(expr: Expression, what: str) -> str:
    owners = owners_of(expr)
    if len(owners) > 1:
        clients = sorted(owners)
        raise FedModelError(
            f"{what} {expr} mixes data of {', '.join(repr(c) for c in clients)} in one term that "
            "cannot be split by owner (it would move private data between them). Write it as a "
            "sum of per-owner terms, e.g. Σ_i f_i(w; Z_i), or give each block its own term")
    return owners.pop() if owners else SERVER


def group_by_owner(terms: list[Expression], what: str) -> dict[str, list[Expression]]:
    groups: dict[str, list[Expression]] = defaultdict(list)
    for term in terms:
        groups[owner_of_term(term, what)].append(term)
    return dict(groups)


def split_objective(problem: SplitTarget, expr: Expression) -> None:
    """Add each term of `expr` to the objective of the block that owns it."""
    if expr.shape != ():
        raise FedModelError(f"the objective must be scalar; {expr} has shape {expr.shape} "
                            "(wrap it in fm.sum or fm.mean)")
    for owner, terms in group_by_owner(linear_terms(expr), "objective term").items():
        problem.block(owner).minimize(add(*terms))


def split_constraint(problem: SplitTarget, constraint: Constraint) -> None:
    """Place `constraint` on its owner, decoupling it with slacks when it spans several owners."""
    groups = group_by_owner(linear_terms(constraint.expr), "constraint")
    parties = [owner for owner in groups if owner != SERVER or _reads_server_data(groups[owner])]
    relation = Equality if isinstance(constraint, Equality) else Inequality
    if len(parties) <= 1:
        owner = parties[0] if parties else SERVER
        constraint.owner = None
        problem.block(owner).subject_to(constraint)
        return
    name = constraint.name or problem.fresh_constraint_name(SERVER)
    # check every name before changing the model, so an error leaves it as it was
    problem.check_constraint_name(name, SERVER)
    for owner in parties:
        if owner != SERVER:
            problem.check_constraint_name(f"{name}[{owner}]", owner)
    global_terms: list[Expression] = list(groups.get(SERVER, [])) if SERVER not in parties else []
    for owner in parties:
        if owner == SERVER:
            global_terms.extend(groups[owner])
            continue
        slack = Variable(constraint.shape, name=f"{name}_slack_{owner}")
        slack.is_slack = True
        problem.add_slack(slack)
        local = relation(add(*groups[owner]), slack, name=f"{name}[{owner}]")
        problem.block(owner).subject_to(local)
        global_terms.append(slack)
    problem.block(SERVER).subject_to(relation(add(*global_terms), 0.0, name=name))


def _reads_server_data(terms: list[Expression]) -> bool:
    return any(isinstance(leaf, Data) and leaf.owner == SERVER
               for t in terms for leaf in t.leaves())
