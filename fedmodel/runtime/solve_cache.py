"""What a warm re-solve of an unchanged model reuses: its equilibrated copy and its compiled
node programs (issue 27 item 3).

`prob.solve()` twice on the same Problem equilibrated it (`compiler.scaling`) and compiled its
node programs (47 plans at NP adult n = 5) again each time: the equilibrated copy's column scales
are new arrays each solve, so `shared_structure` could not share the plans across solves either.
Here a solve keeps both on the Problem (`Cache`, one per Problem, the last solve's) under the
model's **content key** (`content_key`): a SHA-256 over everything the equilibration and the
compile read — each block's name, kind, weight, private variables, terms and constraints as
DAGs (atom class, parameters, attributes, argument positions), variables by uid, shape and
marks, Parameters by their values, constants and data by dtype, shape and the digest of their
bytes. Nothing is keyed by an array's identity alone: an array changed in place, a Parameter
given a new value, a constraint added all give another key, and the solve computes everything
again (tests/test_adult17.py). Hashing costs ~0.7 ms per MB of data (SHA-256, this machine).

A kept program is restarted (`restart`) to the state its compile left before it is
handed to the next run. Between solves it holds what its last run left (its state, as the
programs of an executor the caller holds do; its chord Hessian's factor, derived, is dropped:
at most one n × n matrix a client is kept). The answer of a client's own-constraint check before the run
(`runtime.own_constraints`) is kept on a kept program only (`kept`), by its start point.

Only models held here and of moderate size are kept (`MAX_DATA_BYTES`, `MAX_BLOCKS`): beyond,
the set-up is a small share of a solve, and a kept copy would double what the model holds. A
program in use (a solve of the same Problem inside a callback, another thread) is never shared:
that run compiles its own.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import hashlib
import inspect
import threading
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from ..expression import Constant, Data, Leaf, Parameter, Variable, is_sparse, postorder
from . import gram_hessian

MAX_DATA_BYTES = 1 << 26     # 64 MB of data arrays: a larger model is not kept
MAX_BLOCKS = 1_000           # blocks: a larger model is not kept
_ATTRIBUTE = "_solve_cache"  # the Problem's attribute holding its `Cache`
_STANDARD = frozenset(("args", "shape", "_eig_cache"))      # (an atom's derived cache)
_SKIP = frozenset(("lhs", "rhs", "expr", "_value", "_solved_value", "_array", "problem_id"))

_ACTIVE: contextvars.ContextVar["Cache | None"] = contextvars.ContextVar("solve_cache", default=None)
_KEPT: "weakref.WeakSet[Any]" = weakref.WeakSet()
_LOCK = threading.Lock()      # (a Cache is taken by one solve at a time: two threads, one Problem)


class Uncacheable(Exception):
    """A part of the model the key cannot describe by content (the solve keeps nothing)."""


class Cache:
    """One Problem's last solve: its content key, its equilibrated copy (None: it had none),
    and its programs by `compile_programs`' options."""

    def __init__(self, key: bytes):
        self.key = key
        self.scaled: Any = None
        self.scaled_done = False
        self.work: Any = None                  # the problem the programs were compiled on
        self.programs: dict[tuple, dict] = {}
        self.pristine: dict[int, Any] = {}     # id(program) -> its state after compile
        self.in_use = False

    def equilibrated(self, problem, build: Callable[[Any], Any]) -> Any:
        """`build(problem)` (the equilibrated copy), the last solve's when kept."""
        if not self.scaled_done:      # (a kept copy is not released: `release`)
            self.scaled, self.scaled_done = build(problem), True
        return self.scaled

    def _drop(self) -> None:
        if self.scaled is not None:
            self.scaled.release()
        for programs in self.programs.values():
            for program in programs.values():
                _KEPT.discard(program)
        self.programs.clear()
        self.pristine.clear()


def content_key(problem) -> bytes:
    """The SHA-256 of what a solve reads of `problem` (module docstring); raises Uncacheable."""
    h = hashlib.sha256()
    slots: dict[int, int] = {}
    feed = lambda *parts: h.update(repr(parts).encode())     # noqa: E731
    feed("problem", problem.name, [v.uid for v in problem.slacks], sorted(problem._constraint_names.items()))
    for block in problem.blocks:
        feed("block", type(block).__name__, block.name, getattr(block, "weight", None),
             [_variable(v) for v in block.private_variables],
             [(d.name, d.owner) for d in block.data_items])
        for term in block.terms:
            feed("term")
            _graph(h, term, slots)
        for constraint in block.constraints:
            feed("constraint", type(constraint).__name__, _attributes(constraint.__dict__, _SKIP))
            _graph(h, constraint.expr, slots)
    return h.digest()


def _graph(h, expr, slots: dict[int, int]) -> None:
    """Each node of `expr`'s DAG (shared nodes once, by their first slot)."""
    for node in postorder([expr]):
        if id(node) in slots:
            continue
        slots[id(node)] = len(slots)
        if isinstance(node, Leaf):
            h.update(repr(_leaf(node)).encode())
            if isinstance(node, Constant):
                _array(h, node.value)
            elif isinstance(node, Parameter) and node.value is not None:
                _array(h, np.asarray(node.value))
        else:
            h.update(repr((type(node).__module__, type(node).__qualname__, node.params(),
                           [slots[id(a)] for a in node.args],
                           _attributes(node.__dict__, _STANDARD))).encode())


def _leaf(node: Leaf) -> tuple:
    if isinstance(node, Variable):
        return _variable(node)
    # the leaf's identity (uid) too: kept programs read the leaf objects they were compiled with,
    # so a term rebuilt on a new Parameter of the same value (and the old one changed later)
    # reused them stale (review17b: "stalled", objective 1.27 where a fresh Problem has 0.786)
    if isinstance(node, Parameter):
        return ("param", node.uid, node.shape, node.sign(), node.value is None)
    if isinstance(node, Data):
        if node.remote:
            raise Uncacheable("data held by a worker")
        return ("data", node.uid, node.name, node.owner)
    if isinstance(node, Constant):
        return ("const", node.uid)
    raise Uncacheable(f"a leaf of type {type(node).__name__}")


def _variable(var: Variable) -> tuple:
    return ("var", var.uid, var.shape, _attributes(var.__dict__, _SKIP))


def _array(h, value: Any) -> None:
    """dtype, shape and bytes of an array (a CSR matrix: its three arrays)."""
    if is_sparse(value):
        h.update(repr(("sparse", value.shape, type(value).__name__)).encode())
        for part in (value.data, value.indices, value.indptr):
            _array(h, np.asarray(part))
        return
    array = np.asarray(value)
    if array.dtype == object:
        raise Uncacheable("an array of objects")
    # a column-major array (`expression._matvec_layout`) is hashed through its transpose: no copy
    flat = array.T if array.ndim > 1 and array.flags.f_contiguous else np.ascontiguousarray(array)
    h.update(repr((array.dtype.str, array.shape, flat is not array)).encode())
    h.update(memoryview(flat).cast("B"))


def _attributes(attributes: dict, skip: frozenset) -> tuple:
    return tuple((k, _simple(v)) for k, v in sorted(attributes.items()) if k not in skip)


def _simple(value: Any) -> Any:
    """`value` as plain data its repr describes fully; Uncacheable for anything else."""
    if value is None or isinstance(value, (bool, int, float, str, complex, np.generic)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_simple(v) for v in value)
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return ("array", value.dtype.str, value.shape, hashlib.sha256(
            np.ascontiguousarray(value).tobytes()).hexdigest())
    raise Uncacheable(f"an attribute of type {type(value).__name__}")


def _small(problem) -> bool:
    if len(problem.blocks) > MAX_BLOCKS or problem.remote_data():
        return False
    held = 0
    for block in problem.blocks:
        for item in block.data_items:
            value = item.value
            held += sum(np.asarray(p).nbytes for p in (value.data, value.indices, value.indptr)) \
                if is_sparse(value) else np.asarray(value).nbytes
    return held <= MAX_DATA_BYTES


def cache_of(problem) -> Cache | None:
    """The Problem's `Cache` for this solve, marked in use: the last one when its content key
    is this one's and no run uses it, else a new one (kept on the Problem unless the last one is
    in use); None when the model is not kept (module docstring)."""
    try:
        key = content_key(problem) if _small(problem) else None
    except Uncacheable:
        key = None
    with _LOCK:
        old: Cache | None = problem.__dict__.get(_ATTRIBUTE)
        if old is not None and old.key == key and not old.in_use:
            old.in_use = True
            return old
        if key is None:
            if old is not None and not old.in_use:      # (a model no longer kept: freed)
                old._drop()
                del problem.__dict__[_ATTRIBUTE]
            return None
        cache = Cache(key)
        cache.in_use = True
        if old is None or not old.in_use:
            if old is not None:
                old._drop()
            problem.__dict__[_ATTRIBUTE] = cache
        return cache


@contextlib.contextmanager
def solving(problem) -> Iterator[Cache | None]:
    """The extent of one solve of `problem`: its `Cache` (or None), whose programs the
    solve's `compile_programs` reuses (`programs`, restarted when handed to a run)."""
    cache = cache_of(problem)      # (in use from here)
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
        if cache is not None:      # (the programs keep the run's state, as on an executor
            for programs in cache.programs.values():   # the caller holds; what a run derived
                for program in programs.values():      # is let go: the factor, the packed and
                    program._factor_cache = None       # Gram forms — a copy of the client's
                    program.__dict__.pop("_low_rank", None)    # rows, `restart` drops it anyway)
                    gram_hessian.release(program.compiled)
            cache.in_use = False


def equilibrated(cache: Cache | None, problem, build: Callable[[Any], Any]) -> Any:
    """`build(problem)`, the equilibrated copy (`compiler.scaling.equilibrate`): `cache`'s."""
    return build(problem) if cache is None else cache.equilibrated(problem, build)


def release(cache: Cache | None, model: Any) -> None:
    """After a run on `model` (an equilibrated copy, or None): `model.release()` unless kept."""
    if model is not None and (cache is None or model is not cache.scaled):
        model.release()


def programs(problem, options: tuple, build: Callable[[], dict]) -> dict:
    """The node programs `build()` compiles for `problem` with `options`: the last solve's,
    restarted, when this solve's `Cache` holds them for this problem (else built, and kept
    when this solve has a Cache for it)."""
    cache = _ACTIVE.get()
    if cache is None or (cache.work is not None and cache.work is not problem):
        return build()
    try:
        kept = cache.programs.get(options)
    except TypeError:          # (an option that is no key: compiled each solve)
        return build()
    if kept is not None:       # (restarted here too: a second run of one solve, ProxAL's fall-back)
        for program in kept.values():
            restart(program, cache.pristine[id(program)])
        return dict(kept)
    if cache.work is None:     # (the first compile of this solve names the problem it is on)
        scaled = cache.scaled.problem if cache.scaled is not None else None
        if problem is not scaled and not _is_original(cache, problem):
            return build()
        cache.work = problem
    built = build()
    if all(hasattr(p, "node_state") for p in built.values()):      # (no `ProgramSpec`)
        cache.programs[options] = dict(built)
        for program in built.values():
            cache.pristine[id(program)] = pristine(program)
            _KEPT.add(program)
    return built


def reused(compile_programs: Callable[..., dict]) -> Callable[..., dict]:
    """`compile_programs(problem, ...)` through `programs`, keyed by its other arguments (a
    list, e.g. the constraints the server holds, as a tuple of them: held by the key)."""
    signature = inspect.signature(compile_programs)

    @functools.wraps(compile_programs)
    def compile(problem, *args, **kwargs) -> dict:
        bound = signature.bind(problem, *args, **kwargs)
        bound.apply_defaults()
        options = tuple((name, tuple(value) if isinstance(value, list) else value)
                        for name, value in list(bound.arguments.items())[1:])
        return programs(problem, options, lambda: compile_programs(problem, *args, **kwargs))
    return compile


def pristine(program) -> tuple:
    """The state a `NodeProgram`'s compile left (`restart` returns to it): its node state and
    the values of its merit's own Parameters (β, ω, centers, multipliers, local penalties)."""
    m = program.compiled.ir
    params = [m.beta, m.prox_weight, m.private_weight, *m.centers.values(),
              *m.multipliers.values(), *m.local_penalties.values()]
    return program.node_state.to_plain(), [(p, p.value) for p in params]


def restart(program, state: tuple) -> None:
    """`program` back at `state` (`pristine`): its node state, its merit's Parameters, and
    nothing a run derived — memoized evaluations, the kept Hessian and its factor, the packed
    form's analysis, the Gram form's rows (its analysis is kept: the data is the same) or its
    refusal (a failed check turns it off for the rest of a run)."""
    plain, params = state
    program.node_state = type(program.node_state)(**{k: copy.deepcopy(v) for k, v in plain.items()})
    for parameter, value in params:
        parameter._assign(value)
    program._factor_cache = program._hessian_key = None
    program.holder = None
    program.__dict__.pop("_low_rank", None)
    if program.compiled.__dict__.get("_gram") is None:     # (a failed check: tried again)
        program.compiled.__dict__.pop("_gram", None)
    gram_hessian.release(program.compiled)                  # (a form's analysis is kept)
    program.compiled.forget()


def _is_original(cache: Cache, problem) -> bool:
    return problem.__dict__.get(_ATTRIBUTE) is cache


def kept(program) -> bool:
    """Whether `program` is kept by a Problem's `Cache` (its data checked by content at the
    start of each solve that uses it)."""
    return program in _KEPT
