"""Name → implementation registries that the upper layers fill: backends and executors.

`Problem.solve("proxal", executor="batched")` is written in the problem layer, which must not
import the backends or the executors above it. It asks here instead. The installed package
declares its implementations as entry points (pyproject.toml, groups `fedmodel.backends` and
`fedmodel.executors`: the standard plugin mechanism, so an add-on package such as a Flower
executor registers itself the same way), loaded the first time their name is asked for; a
module can also register one directly (`register("executor", "mine", MyExecutor)`).

>>> from fedmodel import registry
>>> "proxal" in registry.names("backend")
True
"""
from __future__ import annotations

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
    _REGISTERED[kind][name.lower()] = factory


def names(kind: str) -> list[str]:
    """Every name `lookup(kind, …)` accepts: registered ones and the installed entry points."""
    _check_kind(kind)
    return sorted(set(_REGISTERED[kind]) | {ep.name for ep in entry_points(group=GROUPS[kind])})


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as `name` (case-insensitive), loading its entry point if needed."""
    _check_kind(kind)
    key = name.lower() if isinstance(name, str) else None
    if key not in _REGISTERED[kind]:
        found = [ep for ep in entry_points(group=GROUPS[kind]) if key is not None and ep.name == key]
        if not found:
            known = names(kind)
            hint = "" if known else (" (none is installed: run `pip install -e .` so that the "
                                     "package's entry points are declared)")
            raise FedModelError(f"unknown {kind} {name!r}; choose one of {known}{hint} or pass "
                                f"{'a' if kind == 'backend' else 'an'} {kind} instance")
        _REGISTERED[kind][key] = found[0].load()
    return _REGISTERED[kind][key]
