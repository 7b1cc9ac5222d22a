"""A node's `ProgramSpec` as declarative, validated data: JSON text plus named arrays.

The text lists the nodes of the block's expression DAG in post-order: leaves (variables,
parameters, constants, data) with their uid, name, shape and owner, and atoms by the name of
their class in fedmodel's own atom table (`ATOMS`), their argument indices (always earlier
nodes: no cycle can be written) and their parameters (`ATOM_ATTRIBUTES`: exponents, axes,
index keys, target shapes, as tagged plain data, `wire`). Numbers travel as arrays: constants,
parameter values and data held by the driver under the keys the text names. `decode_spec`
rebuilds the block on the receiving side from those tables only — it imports nothing, calls no
constructor the text names outside them, and checks every node's shape against the one the
text declares — so a spec can describe a model but cannot carry code.

Data the text gives no array for is the receiving node's own: `decode_spec` reads it with the
`local_data(name, shape)` loader the receiver passes (a Flower client: the file its node config
names, `flower.client_app.node_data`), never with anything the sender chose.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

import numpy as np

from .. import atoms as _atoms
from ..atoms.base import Atom
from ..constraints import Equality, Inequality
from ..errors import FedModelError
from ..expression import (Constant, Data, Expression, Leaf, Parameter, Variable, _matvec_layout,
                          _reserve_uid, is_sparse, postorder, sparse_csr)
from .program import ProgramSpec
from .wire import WireError, from_plain, to_plain

FORMAT = "fedmodel.spec/1"
#: entries a decoded variable, parameter or data leaf may have (a larger one is refused unbuilt)
MAX_ENTRIES = 2**28
#: non-expression attributes an atom may carry on the wire (the parameters of the atoms'
#: constructors); an atom with another attribute is refused when it is encoded
ATOM_ATTRIBUTES = frozenset({"p", "M", "lower", "upper", "key", "target", "axis", "count"})
#: names a node may have: no path separators or leading dots (data names become file names)
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-\[\]]*$")
_RELATIONS = {"<=": Inequality, "==": Equality}


def _atom_table() -> dict[str, type[Atom]]:
    """fedmodel's own atoms by class name: the concrete subclasses of `Atom` defined in
    `fedmodel.atoms` (the only classes a decoded spec can instantiate)."""
    found, stack = {}, [Atom]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith(_atoms.__name__ + "."):
                found[sub.__name__] = sub
    return found


ATOMS: dict[str, type[Atom]] = _atom_table()


def encode_spec(spec: ProgramSpec, ship: Callable[[Data], np.ndarray | None]) -> tuple[str, dict[str, np.ndarray]]:
    """(JSON text, arrays by key) of `spec`. `ship(data)`: the array to send for a data leaf,
    or None to leave it to the receiving node (`local_data` of `decode_spec`)."""
    roots: list[Expression] = list(spec.terms)
    for c in spec.constraints:
        roots += [c.lhs, c.rhs, c.expr]
    roots += spec.shared.variables + spec.private.variables
    order = postorder(roots)
    index = {id(node): i for i, node in enumerate(order)}
    arrays: dict[str, np.ndarray] = {}

    def put(value: Any, key: str) -> Any:
        if is_sparse(value):
            arrays[key + ".data"], arrays[key + ".indices"], arrays[key + ".indptr"] = \
                value.data, value.indices, value.indptr
            return {"sparse": key, "shape": list(value.shape)}
        arrays[key] = np.asarray(value, dtype=float)
        return key

    nodes = []
    for i, node in enumerate(order):
        if isinstance(node, Leaf):
            entry = {"uid": node.uid, "name": node.name, "shape": list(node.shape)}
            if isinstance(node, Variable):
                entry.update(op="variable", owner=node.owner)
            elif isinstance(node, Parameter):
                entry.update(op="parameter", nonneg=node.sign()[0], nonpos=node.sign()[1],
                             value=None if node.value is None else put(node.value, f"n{i}"))
            elif isinstance(node, Data):
                value = node._array if not node.remote else ship(node)
                entry.update(op="data", owner=node.owner,
                             value=None if value is None else put(value, f"n{i}"))
            elif isinstance(node, Constant):
                entry.update(op="constant", value=put(node.value, f"n{i}"))
            else:
                raise WireError(f"spec of {spec.name!r}: a leaf of type {type(node).__name__} "
                                "has no wire form")
        else:
            name = type(node).__name__
            if ATOMS.get(name) is not type(node):
                raise WireError(f"spec of {spec.name!r}: atom {name!r} is not one of fedmodel's atoms")
            attrs = {k: v for k, v in node.__dict__.items()
                     if k not in ("args", "shape") and not k.startswith("_")}
            extra = set(attrs) - ATOM_ATTRIBUTES
            if extra:
                raise WireError(f"spec of {spec.name!r}: atom {name} has attributes {sorted(extra)} "
                                "without a wire form (add them to spec_codec.ATOM_ATTRIBUTES)")
            entry = {"op": "atom", "atom": name, "args": [index[id(a)] for a in node.args],
                     "attrs": to_plain(attrs, f"atom {name}"), "shape": list(node.shape)}
        nodes.append(entry)
    constraints = [{"relation": c.relation, "lhs": index[id(c.lhs)], "rhs": index[id(c.rhs)],
                    "expr": index[id(c.expr)], "name": c.name, "owner": c.owner}
                   for c in spec.constraints]
    text = json.dumps({"format": FORMAT, "name": spec.name, "role": spec.role,
                       "project": bool(spec.project), "local": bool(getattr(spec, "local", False)), "nodes": nodes,
                       "terms": [index[id(t)] for t in spec.terms], "constraints": constraints,
                       "shared": [index[id(v)] for v in spec.shared.variables],
                       "private": [index[id(v)] for v in spec.private.variables]},
                      separators=(",", ":"))
    return text, arrays


def decode_spec(text: str, arrays: dict[str, np.ndarray],
                local_data: Callable[[str, tuple], Callable[[], Any]] | None = None) -> ProgramSpec:
    """The `ProgramSpec` of `encode_spec`'s text and arrays, rebuilt from fedmodel's own tables;
    a WireError (nothing built, nothing run) for anything else. `local_data(name, shape)`: the
    loader of a data leaf the text gives no array for (None: such a spec is refused)."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError) as err:
        raise WireError(f"model spec: not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise WireError(f"model spec: not a {FORMAT!r} document")
    block = _text(doc.get("name"), "block name", "model spec")
    where = f"model spec of {block!r}"
    role = doc.get("role")
    if role not in ("client", "server"):
        raise WireError(f"{where}: role {role!r}")
    nodes: list[Expression] = []
    raw = doc.get("nodes")
    if not isinstance(raw, list):
        raise WireError(f"{where}: no node list")
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise WireError(f"{where}: node {i} is not an object")
        nodes.append(_node(entry, nodes, arrays, local_data, f"{where}, node {i}", block))

    def pick(j: Any, what: str, kind: type = Expression) -> Any:
        if not (isinstance(j, int) and not isinstance(j, bool) and 0 <= j < len(nodes)) \
                or not isinstance(nodes[j], kind):
            raise WireError(f"{where}: {what} {j!r} is not a {kind.__name__} node")
        return nodes[j]

    terms = [pick(j, "term") for j in _list(doc.get("terms"), where)]
    for t in terms:
        if t.shape != ():
            raise WireError(f"{where}: a term of shape {t.shape} (terms are scalars)")
    constraints = []
    for c in _list(doc.get("constraints"), where):
        if not isinstance(c, dict) or c.get("relation") not in _RELATIONS:
            raise WireError(f"{where}: a constraint must be an object with relation '<=' or '=='")
        made = object.__new__(_RELATIONS[c["relation"]])
        made.lhs, made.rhs = pick(c.get("lhs"), "constraint lhs"), pick(c.get("rhs"), "constraint rhs")
        made.expr = pick(c.get("expr"), "constraint expr")
        made.name = None if c.get("name") is None else _text(c.get("name"), "constraint name", where)
        made.owner = None if c.get("owner") is None else _text(c.get("owner"), "constraint owner", where)
        constraints.append(made)
    shared = [pick(j, "shared variable", Variable) for j in _list(doc.get("shared"), where)]
    private = [pick(j, "private variable", Variable) for j in _list(doc.get("private"), where)]
    return ProgramSpec(block, role, terms, constraints, shared, private, project=bool(doc.get("project")),
                       local=bool(doc.get("local")))


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _text(value: Any, what: str, where: str) -> str:
    if not (isinstance(value, str) and 0 < len(value) <= 1000):
        raise WireError(f"{where}: {what} {str(value)[:80]!r} is not a short string")
    return value


def _name(value: Any, what: str) -> str:
    if not (isinstance(value, str) and len(value) <= 200 and NAME.match(value) and ".." not in value):
        raise WireError(f"model spec: {what} {str(value)[:80]!r} is not a plain name "
                        "(letters, digits, _ . - [ ]; no path)")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not (isinstance(value, list) and len(value) <= 2 and
            all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)):
        raise WireError(f"{where}: shape {value!r} (at most two nonnegative ints)")
    shape = tuple(value)
    if int(np.prod(shape, dtype=np.int64)) > MAX_ENTRIES:
        raise WireError(f"{where}: shape {shape} has more than MAX_ENTRIES = {MAX_ENTRIES} entries")
    return shape


def _value(ref: Any, arrays: dict[str, np.ndarray], shape: tuple, where: str) -> Any:
    """The array a node's `value` names, checked numeric, finite and of the node's shape."""
    try:
        if isinstance(ref, dict) and set(ref) == {"sparse", "shape"} and isinstance(ref["sparse"], str):
            import scipy.sparse as sp
            key = ref["sparse"]
            parts = [arrays.get(f"{key}.{p}") for p in ("data", "indices", "indptr")]
            if any(p is None or np.ndim(p) != 1 for p in parts) or \
                    _shape(ref["shape"], where) != shape or parts[1].dtype.kind != "i" or \
                    parts[2].dtype.kind != "i":
                raise WireError(f"{where}: sparse value {key!r} is incomplete or mis-shaped")
            matrix = sp.csr_array((parts[0], parts[1], parts[2]), shape=shape)
            matrix.check_format(full_check=True)      # indices in range, indptr monotone
            return sparse_csr(matrix, where)
        if not isinstance(ref, str) or ref not in arrays:
            raise WireError(f"{where}: its value {str(ref)[:80]!r} names no array of the message")
        array = np.asarray(arrays[ref])
        if array.dtype.kind not in "fiub" or array.shape != shape:
            raise WireError(f"{where}: value of dtype {array.dtype} and shape {array.shape}, "
                            f"declared shape {shape}")
        return Constant(array).value        # numeric and finite, as any constant (DataError)
    except WireError:
        raise
    except (FedModelError, ValueError, TypeError) as err:
        raise WireError(f"{where}: {err}") from None


def _leaf(cls: type, entry: dict, shape: tuple, where: str, **attrs: Any) -> Leaf:
    """A leaf of class `cls` with the sender's uid (kept: values and multipliers are keyed by it)."""
    uid = entry.get("uid")
    if not (isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid < 2**62):
        raise WireError(f"{where}: uid {uid!r}")
    leaf = object.__new__(cls)
    leaf.__dict__.update(shape=shape, uid=uid, name=_text(entry.get("name"), "leaf name", where), **attrs)
    _reserve_uid(uid)
    return leaf


def _node(entry: dict, nodes: list, arrays: dict, local_data, where: str, block: str) -> Expression:
    op = entry.get("op")
    shape = _shape(entry.get("shape"), where)
    if op == "variable":
        owner = entry.get("owner")
        return _leaf(Variable, entry, shape, where, owner=None if owner is None else _text(owner, "owner", where),
                     _value=None)
    if op == "parameter":
        value = entry.get("value")
        leaf = _leaf(Parameter, entry, shape, where, nonneg=bool(entry.get("nonneg")),
                     nonpos=bool(entry.get("nonpos")), _value=None)
        if value is not None:
            try:
                leaf.value = _value(value, arrays, shape, where)   # (its sign checked: DataError)
            except FedModelError as err:
                raise WireError(f"{where}: {err}") from None
        return leaf
    if op == "constant":
        return _leaf(Constant, entry, shape, where, _array=_value(entry.get("value"), arrays, shape, where))
    if op == "data":
        owner = _text(entry.get("owner"), "data owner", where)
        if owner != block:
            raise WireError(f"{where}: data of {owner!r} in the spec of block {block!r}")
        if entry.get("value") is not None:
            array = _value(entry.get("value"), arrays, shape, where)
            return _leaf(Data, entry, shape, where, owner=owner, loader=None,
                         _array=_matvec_layout(array))
        if local_data is None:
            raise WireError(f"{where}: data {entry.get('name')!r} has no value and this receiver "
                            "reads no data of its own")
        name = _name(entry.get("name"), "data name")
        return _leaf(Data, entry, shape, where, owner=owner, loader=local_data(name, shape),
                     _array=None)
    if op == "atom":
        name = entry.get("atom")
        cls = ATOMS.get(name) if isinstance(name, str) else None
        if cls is None:
            raise WireError(f"{where}: {str(name)[:80]!r} is not one of fedmodel's atoms "
                            f"({', '.join(sorted(ATOMS))})")
        args = _list(entry.get("args"), where)
        if not all(isinstance(j, int) and not isinstance(j, bool) and 0 <= j < len(nodes) for j in args):
            raise WireError(f"{where}: arguments {args!r} must be indices of earlier nodes")
        attrs = from_plain(entry.get("attrs"), where)
        if not isinstance(attrs, dict) or set(attrs) - ATOM_ATTRIBUTES:
            raise WireError(f"{where}: atom attributes must be a dict with keys from "
                            f"{sorted(ATOM_ATTRIBUTES)}")
        atom = object.__new__(cls)
        atom.__dict__.update(attrs)
        atom.args = tuple(nodes[j] for j in args)
        try:        # the atom's own shape rule on its arguments (as `Atom.with_args`)
            atom.shape = atom.shape_from_args()
        except Exception as err:      # any failure of a malformed node is a refusal, not a crash
            raise WireError(f"{where}: {name} on these arguments: {type(err).__name__}: {err}") from None
        if tuple(atom.shape) != shape:
            raise WireError(f"{where}: {name} has shape {atom.shape}, declared {shape}")
        return atom
    raise WireError(f"{where}: unknown node op {str(op)[:40]!r}")
