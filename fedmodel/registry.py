"""Name → implementation registries that the upper layers fill: backends and executors.

`Problem.solve("proxal", executor="batched")` is written in the problem layer, which must not
import the backends or the executors above it. It asks here instead. The installed package
declares its implementations as entry points (pyproject.toml, groups `fedmodel.backends` and
`fedmodel.executors`: the standard plugin mechanism, so an add-on package such as a Flower
executor registers itself the same way), loaded the first time their name is asked for; a
module can also register one directly (`register("executor", "mine", MyExecutor)`). The
installed entry points are read once per process (`installed`): each read scans every installed
distribution's metadata (~16 ms on a machine with ~1,000 of them), and a solve asked twice.

>>> from fedmodel import registry
>>> "proxal" in registry.names("backend")
True
"""
from __future__ import annotations

import difflib
import functools
import inspect
from importlib.metadata import entry_points
from typing import Any, Callable

from .errors import FedModelError

GROUPS = {"backend": "fedmodel.backends", "executor": "fedmodel.executors"}
_REGISTERED: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in GROUPS}


def _check_kind(kind: str) -> None:
    if kind not in GROUPS:
        raise FedModelError(f"unknown registry {kind!r}; use one of {sorted(GROUPS)}")


def register(kind: str, name: str, factory: Callable[..., Any]) -> None:
    """Make `factory` (a class or a function returning an instance) available by `name`."""
    _check_kind(kind)
    _REGISTERED[kind][name.lower()] = checked_options(factory, name) if kind == "backend" else factory


@functools.lru_cache(maxsize=None)
def _scan() -> dict[str, tuple[Any, ...]]:
    """The entry points of every group in GROUPS, from one scan of the installed distributions."""
    found = entry_points()
    return {kind: tuple(found.select(group=group)) for kind, group in GROUPS.items()}


def installed(kind: str) -> tuple[Any, ...]:
    """The installed entry points (`importlib.metadata.EntryPoint`) of registry `kind`, read
    once per process; `refresh()` reads them again (after installing a plugin package)."""
    _check_kind(kind)
    return _scan()[kind]


def refresh() -> None:
    """Forget the entry points read so far: the next lookup scans the installed packages again."""
    _scan.cache_clear()


def names(kind: str) -> list[str]:
    """Every name `lookup(kind, …)` accepts: registered ones and the installed entry points."""
    return sorted(set(_REGISTERED[kind]) | {ep.name for ep in installed(kind)})


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as `name` (case-insensitive), loading its entry point if needed."""
    _check_kind(kind)
    key = name.lower() if isinstance(name, str) else None
    if key not in _REGISTERED[kind]:
        found = [ep for ep in installed(kind) if key is not None and ep.name == key]
        if not found:
            known = names(kind)
            hint = "" if known else (" (none is installed: run `pip install -e .` so that the "
                                     "package's entry points are declared)")
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1) if key else []
            mean = f"did you mean {close[0]!r}? " if close else ""
            raise FedModelError(f"unknown {kind} {name!r}; {mean}choose one of {known}{hint} or pass "
                                f"{'a' if kind == 'backend' else 'an'} {kind} instance")
        factory = found[0].load()
        _REGISTERED[kind][key] = checked_options(factory, key) if kind == "backend" else factory
    return _REGISTERED[kind][key]


def unknown_option(name: str, given: str, valid: list[str]) -> str:
    """The message for an option `given` that backend `name` does not take, with the closest
    valid one (difflib, or the longest valid option the given one starts with: "tolerance" →
    "tol") when there is one."""
    close = difflib.get_close_matches(given, valid, n=1) or \
        sorted((v for v in valid if given.startswith(v)), key=len, reverse=True)[:1]
    hint = f"did you mean {close[0]!r}?" if close else f"its options are {sorted(valid)}"
    return f"unknown option {given!r} for backend {name!r}; {hint}"


def checked_options(factory: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`factory` (a backend class) whose constructor raises FedModelError, not TypeError, for
    arguments its signature does not take — a misspelt option names the closest valid one —, so
    `backends.ProxAL(betta=3)` and `prob.solve("proxal", betta=3)` say what to write. The class
    is changed in place once (its subclasses that define their own constructor when they are
    looked up); a constructor that takes **kwargs accepts anything and is left as it is."""
    if not isinstance(factory, type) or "__init__" not in factory.__dict__ \
            or getattr(factory.__init__, "_checks_options", False):
        return factory
    init = factory.__init__
    signature = inspect.signature(init)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return factory
    valid = [p for p, v in signature.parameters.items()
             if p != "self" and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        label = getattr(type(self), "name", None) or name
        for given in kwargs:
            if given not in valid:
                raise FedModelError(unknown_option(label, given, valid))
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:          # too many positional arguments, a repeated one
            raise FedModelError(f"backend {label!r}: {exc}; its options are {valid}") from None
        init(self, *args, **kwargs)

    __init__._checks_options = True
    factory.__init__ = __init__
    return factory
