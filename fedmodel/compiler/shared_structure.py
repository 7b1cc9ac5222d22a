"""Compile once per structure: the derived expressions and plans of node programs whose
expression graphs are the same up to their data, derived and compiled for the first program of
a structure and re-bound to each other program's own leaves.

A node program (`runtime.compiled_merit.CompiledMerit`) derives expressions from its sources
(the gradients of its merit, the Hessian-vector product's) and compiles plans of them. With
many clients of one model these graphs differ only in their data constants and the merit's
Parameters, and deriving and compiling them once per client was most of a cold solve at 1,000
clients (docs/BENCHMARKS.md, "6,072 plans"). Here:

- `structure_key` describes the sources' DAG with every data leaf replaced by a slot of the same
  kind: an array of `Data` by (class, shape, dtype, dense or sparse) — two CSR matrices of other
  patterns share the code, not the data —, a Parameter by (shape, declared sign), a variable by
  its place among the program's inputs. What a derivation may read the value of stays in the
  key by value: constants of one entry (`multiply` folds them, `divide` inverts them) and
  plain `Constant` arrays (`neg` folds them), the latter by identity.
- `Binding.derive` returns the derivation recorded for the structure's first program with its
  new nodes copied onto this program's leaves (as `Atom.with_args` copies a node; nothing is
  derived or checked again);
  `Binding.plan` re-binds the first program's `codegen.Plan` (`Plan.rebound`: its steps on the
  cloned nodes, its constants this program's, its folded constants computed again from them).
  The same operations in the same order: results bit for bit as if compiled alone.
- A derivation that creates a leaf whose value could depend on data (a `Data` leaf, a new
  array of more than one entry, zeros too: quad_form's P + Pᵀ is zero for a zero or
  antisymmetric P of one client and not another's) is not shared. The first re-binding of each derivation and plan of a
  structure is also checked against the program's own derivation and compilation (same nodes,
  same leaves, bitwise the same constants); on a difference that derivation is no longer shared.

Each process has its own cache, so a Ray or Flower node compiles only its own program from its
spec, as before; nothing executable travels.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import numpy as np

from ..expression import Constant, Data, Expression, Leaf, Parameter, Variable, is_sparse, postorder

# structure key -> its family, held only by its first program (`Binding._own`): the entry goes
# with that program, and with it the graphs (its data) the records hold
_FAMILIES: "weakref.WeakValueDictionary[tuple, Family]" = weakref.WeakValueDictionary()
_STANDARD = frozenset(("args", "shape"))
_DROPPED = ("_eig_cache",)    # value-dependent caches an atom keeps (QuadForm's eigenvalues)


class _Record:
    """One derivation (its output expressions) or plan of a structure, as its first program
    produced it, with the nodes that derivation made (cloned for the other programs)."""

    __slots__ = ("result", "new_nodes", "shared", "checked")

    def __init__(self, result: Any, new_nodes: list | None):
        self.result, self.new_nodes = result, new_nodes
        self.shared, self.checked = True, False


class Family:
    """The programs of one structure: the first one's (`template`) records by name. It lives
    as long as that program (its graphs and data are the records'; the other programs hold it
    weakly): the next program of the structure after it starts a new family."""

    def __init__(self, template: "Binding", key: tuple):
        self._template = weakref.ref(template)
        self.key = key
        self.records: dict[tuple[str, str], _Record] = {}    # by ("derive" or "plan", name)
        self.rebound = 0     # derivations and plans re-bound (not derived or compiled again)
        self._settled = 0    # records whose new nodes are found (`settle`)
        self._known: set[int] | None = None

    @property
    def template(self) -> "Binding | None":
        return self._template()

    def settle(self) -> None:
        """Find each derivation's new nodes (not among the template's sources and earlier
        derivations), in the order they were derived, and whether it may be shared: only once a
        second program asks (a structure of one program never pays for it)."""
        records = list(self.records.values())
        if self._settled == len(records):
            return
        if self._known is None:
            self._known = {id(n) for n in self.template.order}
        for record in records[self._settled:]:
            if record.new_nodes is None:
                _settle(record, self._known)
        self._settled = len(records)


class Binding:
    """One program's place in its structure's `Family`: the map from the template's nodes to
    this program's own (by position in the sources, then by the clones made for it)."""

    def __init__(self, owner: Any, sources: Sequence[Expression], inputs: Sequence[Leaf]):
        self._owner = weakref.ref(owner)     # (the owner keeps its binding: no cycle)
        self.order = list(inputs) + postorder(list(sources))
        self.key = structure_key(self.order, len(inputs))
        self._family: "weakref.ref[Family] | None" = None
        self._own: Family | None = None      # the family this program leads (held here only)
        self._map: dict[int, Expression] | None = None     # template node id -> own node

    owner = property(lambda self: self._owner(), doc="The program this binding is of.")

    @property
    def family(self) -> Family:
        """The family of this structure; a new one led by this program when there is none
        (the first program of the structure, or its first program was freed)."""
        family = self._family() if self._family is not None else None
        if family is None or family.template is None:
            family = _FAMILIES.get(self.key)
            if family is None or family.template is None:
                family = self._own = _FAMILIES[self.key] = Family(self, self.key)
            self._family, self._map = weakref.ref(family), None
            self.key = family.key   # one key object per structure (memory: 10⁴ clients)
        return family

    @property
    def is_template(self) -> bool:
        return self.family.template is self

    def counterparts(self) -> dict[int, Expression]:
        """A copy of the map from the template's nodes (by id) to this program's own: its
        sources and the clones of the derivations re-bound so far (`clone_onto` extends it)."""
        return dict(self._node_map())

    def _node_map(self) -> dict[int, Expression]:
        if self._map is None:
            order = self.family.template.order
            self._map = {id(t): own for t, own in zip(order, self.order)}
        return self._map

    # ---- derived expressions and plans -------------------------------------------------------
    def derive(self, name: str, build: Callable[[Any], list]) -> list:
        """`build(owner)` (a list of expressions derived from the sources and from earlier
        derivations of this binding), derived once per structure."""
        added: list[int] = []
        return self._shared("derive", name, build, lambda outputs: _Record(list(outputs), None),
                            lambda record: self._clone(record, added), _same_graphs,
                            lambda: self._forget(added))

    def plan(self, name: str, build: Callable[[Any], Any]) -> Any:
        """`build(owner)` (a `codegen.Plan` of this program's sources and derivations),
        compiled once per structure and re-bound to each program's nodes."""
        return self._shared("plan", name, build, lambda plan: _Record(plan, []),
                            lambda record: record.result.rebound(_by_id(self._node_map())),
                            _same_plans, lambda: None)

    def _shared(self, kind: str, name: str, build: Callable, record_of: Callable,
                rebind: Callable, same: Callable, undo: Callable) -> Any:
        """The template's `build` result, recorded (`record_of`); for the other programs the
        record re-bound to their nodes (`rebind`), checked against their own `build` the first
        time (`same`; `undo` forgets a re-binding not used)."""
        family, key = self.family, (kind, name)
        if family.template is self:
            record = family.records.get(key)
            if record is None:
                family.records[key] = record = record_of(build(self.owner))
            return record.result
        record = family.records.get(key)
        if record is None:
            getattr(family.template, kind)(name, build)
            record = family.records[key]
        family.settle()
        if not record.shared or record.result is None:
            return build(self.owner)
        try:
            result = rebind(record)
        except KeyError:        # a node the template had and this program has not: compile alone
            undo()
            return build(self.owner)
        if not record.checked:
            record.checked = True
            own = build(self.owner)
            if not same(result, own):
                record.shared = False
                undo()
                return own
        family.rebound += 1
        return result

    def _forget(self, added: list[int]) -> None:
        """Drop clones that are not this program's nodes after all (a failed derivation)."""
        node_of = self._node_map()
        for key in added:
            node_of.pop(key, None)

    def _clone(self, record: _Record, added: list[int]) -> list:
        node_of = self._node_map()
        for node in record.new_nodes:
            if isinstance(node, Parameter):
                new = Parameter(node.shape, name=node.name, nonneg=node.nonneg, nonpos=node.nonpos)
                if node.value is not None:
                    new._assign(np.array(node.value))
            elif isinstance(node, Leaf):       # a one-entry constant (`_shareable_leaf`)
                new = node
            else:
                new = node.with_args(*[node_of[id(a)] for a in node.args])
                for cache in _DROPPED:
                    new.__dict__.pop(cache, None)
            node_of[id(node)] = new
            added.append(id(node))
        return [node_of[id(o)] for o in record.result]


def clone_onto(node: Expression, node_of: dict[int, Expression]) -> Expression:
    """`node`'s counterpart in `node_of` (template node id -> a program's own node), its nodes
    not there copied onto their arguments' counterparts (as `Binding.derive` clones a
    derivation's) and added; KeyError for a leaf another program may not share
    (`_shareable_leaf`) — a reading made on the template's nodes, re-bound."""
    found = node_of.get(id(node))
    if found is None:
        if isinstance(node, Leaf):
            if isinstance(node, Parameter) or not _shareable_leaf(node):
                raise KeyError(id(node))
            found = node
        else:
            found = node.with_args(*[clone_onto(a, node_of) for a in node.args])
            for cache in _DROPPED:
                found.__dict__.pop(cache, None)
        node_of[id(node)] = found
    return found


def clear() -> None:
    """Forget every structure (tests; the next program of each compiles alone again)."""
    _FAMILIES.clear()


def _settle(record: _Record, known: set[int]) -> None:
    """A template's derivation: its nodes not seen before (`known`), in order (they are cloned
    for the other programs), and whether it may be shared (no new leaf whose value may be data's)."""
    record.new_nodes = [n for n in postorder(record.result) if id(n) not in known]
    record.shared = all(_shareable_leaf(n) for n in record.new_nodes if isinstance(n, Leaf))
    known.update(id(n) for n in record.new_nodes)


def _by_id(node_of: dict[int, Expression]) -> Callable[[Expression], Expression]:
    return lambda node: node_of[id(node)]


def _shareable_leaf(leaf: Leaf) -> bool:
    """A leaf a derivation created that every program of the structure may have as is (a
    Parameter is made anew per program): a plain constant of one entry (from the key's own
    values). A derived array (`divide` by data, quad_form's P + Pᵀ — all zeros for one client's
    P, not for the next one's) is not."""
    if isinstance(leaf, Parameter):
        return True
    if type(leaf) is not Constant:
        return False
    value = leaf.value
    if is_sparse(value):
        return False
    return value.size <= 1


# ---- the structural key ----------------------------------------------------------------------
def structure_key(order: Sequence[Expression], n_inputs: int) -> tuple:
    """The DAG of `order` (inputs first, then a postorder) with data leaves as slots."""
    position: dict[int, int] = {}
    first_value: dict[int, int] = {}
    parts: list[tuple] = []
    for i, node in enumerate(order):
        if id(node) in position:          # an input that is also a source node
            parts.append(("again", position[id(node)]))
            continue
        position[id(node)] = i
        if isinstance(node, Leaf):
            parts.append(_leaf_part(node, i, n_inputs, first_value))
        else:
            extras = tuple((k, _hashable(v)) for k, v in node.__dict__.items()
                           if k not in _STANDARD and k not in _DROPPED)
            parts.append((type(node), node.params(), tuple(position[id(a)] for a in node.args), extras))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:         # an atom's attribute we cannot compare: compiled alone
        return ("alone", object())      # (an object of its own: equal to no other key)
    return key


def _leaf_part(node: Leaf, i: int, n_inputs: int, first_value: dict[int, int]) -> tuple:
    if isinstance(node, Variable):
        sign = (getattr(node, "nonneg", False), getattr(node, "nonpos", False))
        return ("var", node.shape, sign) if i < n_inputs else ("var-uid", node.uid)
    if isinstance(node, Parameter):
        return ("param", node.shape, node.sign())
    if not isinstance(node, Constant):
        return ("leaf", type(node), node.uid)
    value = node.value
    same = first_value.setdefault(id(value), i)     # a plan keeps one slot per array object
    if is_sparse(value):
        if type(node) is Constant:
            return ("const-id", id(value), same)
        return ("sparse", type(node), value.shape, value.dtype.str, same)
    if value.size <= 1:
        return ("scalar", type(node), value.shape, value.dtype.str, value.tobytes(), same)
    if not isinstance(node, Data):
        return ("const-id", id(value), same)
    return ("data", type(node), value.shape, value.dtype.str, same)


def _hashable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (tuple, list)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    return value


# ---- the checks of a first re-binding ----------------------------------------------------------
def _same_graphs(cloned: list, own: list) -> bool:
    """Whether a cloned derivation is the program's own up to its new leaves' identities."""
    a, b = postorder(cloned), postorder(own)
    if len(a) != len(b) or len(cloned) != len(own):
        return False
    index_a = {id(n): i for i, n in enumerate(a)}
    index_b = {id(n): i for i, n in enumerate(b)}
    if [index_a[id(n)] for n in cloned] != [index_b[id(n)] for n in own]:
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, Leaf):
            if isinstance(x, Parameter):
                if x.shape != y.shape or x.sign() != y.sign():
                    return False
            elif not (isinstance(x, Constant) and _same_value(x.value, y.value)):
                return False
            continue
        if x.params() != y.params() or x.shape != y.shape or \
                [index_a[id(n)] for n in x.args] != [index_b[id(n)] for n in y.args]:
            return False
    return True


def _same_plans(rebound: Any, own: Any) -> bool:
    """Whether a re-bound plan is the one the program compiles itself: the same generated
    code, the same nodes, inputs and Parameters, bitwise the same constants."""
    if rebound.structure_key != own.structure_key or rebound.n_steps != own.n_steps:
        return False
    if any(x is not y for x, y in zip(rebound.inputs, own.inputs)) or \
            any(x is not y for x, y in zip(rebound.outputs, own.outputs)):
        return False
    if any(fa.__self__ is not fb.__self__ or aa != ab or oa != ob
           for (fa, aa, oa), (fb, ab, ob) in zip(rebound.steps, own.steps)):
        return False
    if [(s, id(p)) for s, p in rebound.params] != [(s, id(p)) for s, p in own.params]:
        return False
    return rebound.constant_slots == own.constant_slots and all(
        _same_value(rebound.constant(s), own.constant(s)) for s in own.constant_slots)


def _same_value(x: Any, y: Any) -> bool:
    if is_sparse(x) or is_sparse(y):
        if not (is_sparse(x) and is_sparse(y)) or x.shape != y.shape:
            return False
        x, y = x.tocsr(), y.tocsr()
        return all(_same_value(np.asarray(getattr(x, f)), np.asarray(getattr(y, f)))
                   for f in ("data", "indices", "indptr"))
    x, y = np.asarray(x), np.asarray(y)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
