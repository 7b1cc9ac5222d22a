"""`executor="auto"`: the in-process executor that should run a given set of node programs
fastest — serial, batched or JAX — picked when the run starts, from what is known then.

The rule (`choose`; measurements behind it: docs/executors.md "auto", docs/jax.md "Scale"):

1. **serial** when no group of same-structure clients has `MIN_GROUP` members: there is
   nothing to vectorize, and grouping costs a signature per client (checked after grouping:
   the chosen executor's groups decide, so the signatures are computed once).
2. **jax** when JAX is installed, finds a GPU, and the clients' data has at least
   `GPU_MIN_ENTRIES` entries: only JAX runs the clients there. On an H200 (docs/jax.md "GPU")
   a JAX iteration on the GPU cost ~3 ms whatever the size (host↔device copies, launches,
   the host's server step) plus ~0.5 ns per data entry, the batched one on the CPU 2.5–4 ns per
   entry: JAX was 2.6–10× faster from 5.5·10⁶ entries, 1.5–1.9× slower at 5.6·10⁵. Below
   the threshold the CPU rules 3–5 decide.
3. **batched** when the clients' data is mostly zeros (`dense_blocks.DENSE_FRACTION`): its
   CSR products skip the zeros, JAX pads and multiplies them.
4. **jax** when JAX is installed, the shared model has at least `JAX_MIN_WIDTH` entries and
   the memory available holds `JAX_MEMORY` × the data (JAX's padded device copy and
   temporaries; at n = 10⁴, d = 784 its run peaked at 16.3 GB, the batched one at 8.3 GB):
   XLA fuses the products with the loss terms and ran 1.05–1.3× ahead of numpy at d = 784.
5. **batched** otherwise: at d = 10 it was 1.4–2.3× faster than JAX for n ≤ 10⁴ (XLA's
   exp / log1p over padded buckets cost more than numpy's batched plans) with ~0.7× the
   memory; or JAX is not installed.

Every choice gives the serial executor's numbers (each executor is tested against it), so the
rule affects speed only. `AutoExecutor().start(programs)` returns the chosen executor, started
(backends use what `start` returns); `chosen` and `reason` say which and why.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from .executor import Executor, SerialExecutor
from .program import NodeProgram, ProgramSpec

# fewer same-structure clients than this in every group: serial. Measured (bench_scale, d = 10
# and 784): batched was 1.2–1.5× faster per iteration than serial at 4 clients, 1.8–2.7× at 8;
# a batched iteration has a floor of ~0.24 ms (its group requests), what serial spends on 2–3
MIN_GROUP = 4
JAX_MIN_WIDTH = 100     # shared model entries from which JAX runs dense CPU groups
SAMPLE = 16             # clients whose data decides "mostly zeros"
JAX_MEMORY = 3.0        # JAX's extra memory, × the data (n = 10⁴, d = 784: 16.3 GB vs batched's 8.3)
GPU_MIN_ENTRIES = 1e6   # client data entries from which a GPU beats the CPU (rule 2)
# clients from which the default executor (`DefaultExecutor`) vectorizes: a fresh process's
# first batched run loads numba's kernels (~0.5–1 s); measured on logistic + ball clients, d = 10,
# 22–63 round trips: serial's whole solve was faster at 5–20 clients, batched's from 40
DEFAULT_MIN_CLIENTS = 32


def jax_available() -> bool:
    """Whether JAX can be imported here (without importing it)."""
    return importlib.util.find_spec("jax") is not None


#: the packages through which JAX reaches an accelerator (jax[cuda12] installs the first two)
GPU_PLUGINS = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
               "jax_rocm7_plugin")


def gpu_available() -> bool:
    """Whether JAX is installed and sees a GPU. JAX is imported only where a GPU plugin is
    installed (a CPU-only jaxlib has none: no import, ~0.5 s and 100 MB saved)."""
    if not jax_available() or not any(importlib.util.find_spec(m) for m in GPU_PLUGINS):
        return False
    try:
        import jax
        return any(device.platform == "gpu" for device in jax.devices())
    except Exception:           # a broken accelerator plugin: run on the CPU
        return False


def _sampled_data(programs: list[NodeProgram]):
    """The 2-D data arrays of up to `SAMPLE` client programs (each array once: a folded Xᵀ is
    a view of X)."""
    for program in programs[:SAMPLE]:
        plan = program.value_grad_plan
        seen: set[tuple] = set()
        for slot in plan.constant_slots:
            value = plan.constant(slot)
            if isinstance(value, np.ndarray) and value.ndim == 2 and value.size > 1:
                key = (value.__array_interface__["data"][0], tuple(sorted(value.shape)))
                if key not in seen:     # (X and its view Xᵀ: same memory, same shape sorted)
                    seen.add(key)
                    yield value


def data_density(programs: list[NodeProgram]) -> float:
    """Fraction of nonzero entries in the 2-D data of up to `SAMPLE` client programs (1.0 when
    they have none): the batched executor's CSR products pay off below `DENSE_FRACTION`."""
    nonzero = total = 0
    for value in _sampled_data(programs):
        nonzero += int(np.count_nonzero(value))
        total += value.size
    return nonzero / total if total else 1.0


def data_bytes(programs: list[NodeProgram]) -> float:
    """The clients' 2-D data in bytes, estimated from the sampled clients' mean."""
    sample = programs[:SAMPLE]
    if not sample:
        return 0.0
    return sum(v.nbytes for v in _sampled_data(sample)) / len(sample) * len(programs)


def available_memory() -> float:
    """Bytes of memory available to this process now (inf where the OS does not say)."""
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return float("inf")


def choose(programs: list[NodeProgram], jax_installed: bool | None = None,
           gpu: bool | None = None, memory: float | None = None, cpu_jax: bool = True) -> tuple[str, str]:
    """(executor name, reason) for the client `programs` of a run, before grouping (rules 2–5
    of the module docstring; rule 1 is applied to the chosen executor's groups).
    `jax_installed` / `gpu` / `memory` (available bytes): as found here unless given (tests).
    `cpu_jax=False` leaves rule 4 out (JAX on the CPU): the default executor's choice."""
    clients = [p for p in programs if p.role == "client"]
    if len(clients) < MIN_GROUP:
        return "serial", f"{len(clients)} clients (< {MIN_GROUP}): nothing to vectorize"
    jax_installed = jax_available() if jax_installed is None else jax_installed
    on_gpu = jax_installed and (gpu_available() if gpu is None else gpu)
    entries = data_bytes(clients) / 8 if on_gpu else 0.0
    if on_gpu and entries >= GPU_MIN_ENTRIES:
        return "jax", f"a GPU is present and the clients' data has {entries:.2g} entries: JAX runs them there"
    name, reason = _cpu_choice(clients, jax_installed and cpu_jax, memory)
    if on_gpu:
        reason += (f" (a GPU is present, but {entries:.2g} data entries < {GPU_MIN_ENTRIES:.0e}: a GPU "
                   "iteration's fixed cost is more than the CPU's whole iteration)")
    return name, reason


def _cpu_choice(clients: list[NodeProgram], jax_installed: bool, memory: float | None) -> tuple[str, str]:
    """Rules 3–5 of the module docstring."""
    from .dense_blocks import DENSE_FRACTION
    density = data_density(clients)
    if density < DENSE_FRACTION:
        return "batched", (f"client data {density:.0%} nonzero: the batched executor's sparse "
                           "products skip the zeros")
    width = clients[0].n_shared
    if jax_installed and width >= JAX_MIN_WIDTH:
        need = JAX_MEMORY * data_bytes(clients)
        free = available_memory() if memory is None else memory
        if need <= free:
            return "jax", f"dense data, {width} shared entries (>= {JAX_MIN_WIDTH}): XLA fuses the products"
        return "batched", (f"dense data, {width} shared entries, but JAX would need ~{need / 2**30:.1f} "
                           f"GiB beside the data ({free / 2**30:.1f} GiB available)")
    return "batched", (f"dense data, {width} shared entries" +
                       ("" if jax_installed else ", JAX not installed") +
                       f" (< {JAX_MIN_WIDTH}: numpy's batched plans were faster than XLA's there)")


class AutoExecutor(Executor):
    """Picks serial, batched or JAX at `start` (see the module docstring) and returns that
    executor, started; `chosen` (its name) and `reason` say which and why. `cpu_jax=False`
    (the default executor, `DefaultExecutor`): JAX only on a GPU, never its compile on the CPU."""

    streams_sums = True     # (as every pick does: serial, batched and JAX sum `map_sum`'s replies as they come)

    def __init__(self, cpu_jax: bool = True):
        super().__init__()
        self.cpu_jax = cpu_jax
        self.chosen: str | None = None
        self.reason: str | None = None

    def start(self, programs: dict) -> Executor:
        built = {name: p.build() if isinstance(p, ProgramSpec) else p for name, p in programs.items()}
        name, reason = choose(list(built.values()), cpu_jax=self.cpu_jax)
        if name in ("batched", "jax"):         # one executor, its numpy or JAX engine
            from .batched import BatchedExecutor
            executor: Executor = BatchedExecutor(min_group=MIN_GROUP,
                                                 engine="jax" if name == "jax" else "numpy")
        else:
            executor = SerialExecutor()
        executor.start(built)
        if name != "serial" and not getattr(executor, "groups", None):
            executor.close()
            name, reason = "serial", f"no {MIN_GROUP} clients share one model structure"
            executor = SerialExecutor().start(built)
        self.chosen, self.reason = name, reason
        executor.auto_choice = (name, reason)       # (readable from the run's executor)
        return executor


class DefaultExecutor(AutoExecutor):
    """The executor of a run that names none (`executor=None`): serial below `DEFAULT_MIN_CLIENTS`
    clients, else the auto executor's pick without JAX on the CPU (batched where `MIN_GROUP`
    clients share a structure; JAX only on a GPU). Each gives the serial executor's numbers (a
    server step that reads only the clients' sums: to round-off, ~1e-8, the sums in another
    order). Batched pays numba's load once a process (~0.5–1 s, docs/executors.md "the
    default"), which a short run on few clients does not earn back; JAX's compile on a CPU
    (seconds, for 1.05–1.3× per iteration at d = 784) is for users who ask for it
    (`executor="auto"` or `"jax"`)."""

    def __init__(self):
        super().__init__(cpu_jax=False)

    def start(self, programs: dict) -> Executor:
        clients = sum(1 for p in programs.values() if getattr(p, "role", "client") == "client")
        if clients >= DEFAULT_MIN_CLIENTS:
            return super().start(programs)
        self.chosen, self.reason = "serial", f"{clients} clients (< {DEFAULT_MIN_CLIENTS}): serial's start is the cheapest"
        executor = SerialExecutor().start(programs)
        executor.auto_choice = (self.chosen, self.reason)
        return executor
