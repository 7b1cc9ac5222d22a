"""`executor="jax"`: the batched executor with its JAX engine, by name.

There is one batched executor (`batched.BatchedExecutor`) with two engines: numpy
(`engine="numpy"`, `executor="batched"`) and JAX (`engine="jax"`, fedmodel/runtime/
jax_engine.py: each group's merits by one `jax.vmap` over the client axis). `JaxExecutor()`
is `BatchedExecutor(engine="jax")` under the name the registry and earlier code use; the JAX
engine's names are importable from here as before.
"""
from __future__ import annotations

from .batched import BatchedExecutor
from .jax_engine import JaxEngine, JaxFallbackWarning, JaxGroup, buckets

__all__ = ["JaxExecutor", "JaxEngine", "JaxFallbackWarning", "JaxGroup", "buckets"]


class JaxExecutor(BatchedExecutor):
    """`BatchedExecutor(engine="jax")` (see fedmodel/runtime/jax_engine.py for what runs in
    JAX and what falls back): `stats` counts requests served batched and serially by kind,
    `fallbacks` lists what ran without JAX and why, `jax_calls` what JAX evaluated."""

    def __init__(self, min_group: int = 2, tune_malloc: bool = True):
        super().__init__(min_group=min_group, tune_malloc=tune_malloc, engine="jax")
