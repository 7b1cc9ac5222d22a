"""Backends: the algorithms. Each consumes compiled node programs, never raw data."""
from __future__ import annotations

import importlib
from typing import Any

from fedmodel.errors import FedModelError
from .base import Backend
from .cvxpy_backend import CVXPY

# name -> (module, class); modules are imported when first used
REGISTRY: dict[str, tuple[str, str]] = {
    "cvxpy": ("backends.cvxpy_backend", "CVXPY"),
    "proxal": ("backends.proxal", "ProxAL"),
    "cproxal": ("backends.proxal", "CentralizedProxAL"),
    "dald": ("backends.dald", "DALD"),
    "fedprox": ("backends.special_cases", "FedProx"),
    "fedavg": ("backends.special_cases", "FedAvg"),
    "dgd": ("backends.special_cases", "DistributedGD"),
    "pa": ("backends.special_cases", "ProximalAlgorithm"),
    "fedadmm": ("backends.fedadmm", "FedADMM"),
    "dp-admm": ("backends.dp_admm", "DPADMM"),
}


def make_backend(backend: Any, **options: Any) -> Backend:
    """A backend instance from an instance or a registered name (options go to its constructor)."""
    if isinstance(backend, Backend):
        if options:
            raise FedModelError(f"options {sorted(options)} are for a backend given by name; "
                                "pass them to the backend's constructor instead")
        return backend
    if not isinstance(backend, str) or backend.lower() not in REGISTRY:
        raise FedModelError(f"unknown backend {backend!r}; choose one of {sorted(REGISTRY)} or "
                            "pass a backend instance")
    module_name, class_name = REGISTRY[backend.lower()]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise FedModelError(f"backend {backend!r} is not available in this version") from None
    return getattr(module, class_name)(**options)


def __getattr__(name: str):
    for module_name, class_name in REGISTRY.values():
        if class_name == name:
            return getattr(importlib.import_module(module_name), class_name)
    raise AttributeError(f"module 'backends' has no attribute {name!r}")
