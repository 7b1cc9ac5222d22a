"""Checkpoint and resume for iterative backends (docs/api.md §2: `checkpoint`, `checkpoint_every`,
`resume`). See docs/checkpoints.md.

A checkpoint is one pickle file holding
- `loop`: the backend's own loop state (a plain dict it hands over at the end of an outer
  iteration: iterates, counters, RNG states, the history so far);
- `nodes`: every node program's state, fetched through the executor's `save_state` request and
  given back with `load_state` (so it works with any executor — the driver never reads data),
  without the settings the driver sends in "configure" (`NodeState.SETTINGS`: β, ω): the
  loop state holds β, once, and the resumed loop sends it again;
- `ledger`: the communication ledger so far (a resumed run books the same traffic);
- `fingerprint`: a hash of the problem (structure and data) and of the backend's options — a
  checkpoint of another problem or other settings is refused (runtime/checkpoint_fingerprint.py);
- `outcome`: set once the run has finished, so resuming a finished run returns its result;
- `history`: the loop's `history`, kept out of `loop`: its records' pickles appended, each
  encoded once (runtime/checkpoint_history.py: a save costs O(state + new records)).

Writes are atomic: the file is written to a temporary file in the same directory, flushed and
fsync'ed, then renamed over the old one with `os.replace` (atomic on POSIX and Windows); a kill
at any moment leaves either the old or the new checkpoint, never a torn one.

Variable uids differ between processes, so dicts keyed by variable uid (node proximal centers,
solution values) are stored keyed by the variable's position in `problem.variables()`.
Checkpoints are pickles: load only checkpoints you wrote yourself. A file of another `FORMAT`
(written by an older fedmodel, whose node states name modules that have since moved) is refused
with a `CheckpointError` saying so, not with the error its unpickling would raise.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FedModelError
from .checkpoint_fingerprint import fingerprint
from .checkpoint_history import AppendedHistory, join_history
from .node_state import without_settings

# 2: node states of the refactored runtime and backends (backends.dald package, DALD's node
# steps in backends/dald, DP-ADMM's noise in runtime.privacy, ...); format-1 files pickle classes
# of modules that no longer exist, so they are refused by their format before anything else.
# 3: node states are `NodeState`s' fields (the Hessian without its key, no β: issue 26)
# 4: a packed few-rows Hessian is [N, r, λ, C], its basis re-derived from the data (branch sparse3)
# 5: the loop's history out of `loop`, as its records' pickles appended (`history`; issue 25)
FORMAT = 5


class CheckpointError(FedModelError):
    """A checkpoint that cannot be used: unreadable, or of another problem / backend setting."""


class Checkpointer:
    """Saves and restores a backend's run state. Backends receive one as `run(...,
    checkpointer=...)` (only when their class sets `checkpointing = True`):

        saved = checkpointer.restore(ex)       # after the nodes are initialized; None: fresh run
        ...                                    # end of outer iteration k, after the stop test:
        checkpointer.save(ex, k, {"x": x, "history": history, ...})
    """

    def __init__(self, path: str | os.PathLike | None = None, every: int = 1,
                 fingerprint: str = "", variables: list | None = None):
        self.path = None if path is None else Path(path)
        self.every = int(every)
        self.fingerprint = fingerprint
        self._uids = [v.uid for v in (variables or [])]
        self._loaded: dict[str, Any] | None = None
        self.saves = 0          # number of checkpoint files written by this run
        self.history = AppendedHistory()
        self._pickles: bytes | None = None      # a resumed file's history records' pickles
        self.backend = None

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def create(cls, backend, problem, checkpoint=None, checkpoint_every=None,
               resume: bool = False) -> "Checkpointer":
        """Check the arguments of `solve` and, for `resume=True`, read and check the file.
        `resume=True` with no file yet starts a fresh run (so a crashed job can simply be
        re-run with the same command)."""
        if checkpoint is None:
            if checkpoint_every is not None or resume:
                raise CheckpointError("checkpoint_every and resume=True need checkpoint=PATH "
                                      "(the file the run state is saved to)")
            return NO_CHECKPOINT
        if not getattr(backend, "checkpointing", False):
            raise CheckpointError(f"backend {backend.name!r} does not support checkpoints (its "
                                  "class does not set `checkpointing = True`); use an iterative backend "
                                  "that does, or drop checkpoint=")
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise CheckpointError(f"checkpoint must be a file path, got {type(checkpoint).__name__}")
        every = 1 if checkpoint_every is None else checkpoint_every
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise CheckpointError(f"checkpoint_every must be an integer ≥ 1, got {checkpoint_every!r}")
        path = Path(checkpoint)
        if path.is_dir():
            raise CheckpointError(f"checkpoint {str(path)!r} is a directory; give a file path")
        if not path.parent.exists():
            raise CheckpointError(f"the directory of checkpoint {str(path)!r} does not exist")
        _check_writable(path)
        variables = problem.variables()
        self = cls(path, int(every), fingerprint(problem, backend, FORMAT), variables)
        self.backend = backend.name
        if resume and path.exists():
            self._loaded = self._read(backend)
        return self

    def _read(self, backend) -> dict[str, Any]:
        try:
            with open(self.path, "rb") as f:
                data = pickle.load(f)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
            written = _format_of(self.path)     # an older file may name classes that have moved
            if written is not None and written != FORMAT:
                raise CheckpointError(_other_format(self.path, written)) from None
            raise CheckpointError(f"cannot read checkpoint {str(self.path)!r}: {exc}") from None
        if not isinstance(data, dict) or "format" not in data:
            raise CheckpointError(f"{str(self.path)!r} is not a fedmodel checkpoint (format {FORMAT})")
        if data["format"] != FORMAT:
            raise CheckpointError(_other_format(self.path, data["format"]))
        self._pickles = join_history(data)
        if data["fingerprint"] != self.fingerprint:
            raise CheckpointError(
                f"checkpoint {str(self.path)!r} was written by another run (backend "
                f"{data.get('backend')!r}, {data.get('iteration')} iterations): the problem (its "
                f"structure or data) or the options of backend {backend.name!r} differ. Resume "
                "with the same problem and backend settings, or start a fresh run (resume=False)")
        return data

    # ---- used by backends -----------------------------------------------------------------
    @property
    def iteration(self) -> int:
        """Outer iterations already done according to the loaded checkpoint (0: fresh run)."""
        return int(self._loaded["iteration"]) if self._loaded else 0

    def restore(self, executor) -> dict[str, Any] | None:
        """Load the saved node states into the executor's nodes and the saved ledger; return the
        backend's loop state, or None for a fresh run. Call after the nodes are initialized."""
        if not self._loaded or self._loaded.get("loop") is None:
            return None
        nodes = self._decode(self._loaded["nodes"])
        if sorted(nodes) != sorted(executor.nodes):
            raise CheckpointError(f"checkpoint nodes {sorted(nodes)} differ from this run's "
                                  f"nodes {sorted(executor.nodes)}")
        executor.map("load_state", {node: {"state": state} for node, state in nodes.items()})
        executor.ledger = self._loaded["ledger"]
        loop = self._decode(self._loaded["loop"])
        self.history.resume(self._pickles, loop.get("history"))
        return loop

    def save(self, executor, iteration: int, loop: dict[str, Any]) -> bool:
        """At the end of outer iteration `iteration` (1-based), save when it is a multiple of
        `every`. `loop` must hold everything the loop needs to continue, history included."""
        if self.path is None or iteration % self.every:
            return False
        nodes = {n: without_settings(r["state"])
                 for n, r in executor.map("save_state", {n: {} for n in executor.nodes}).items()}
        history, loop = loop.get("history"), dict(loop)
        appended = {"history": self.history.bytes_of(loop.pop("history"), self._encode)} \
            if isinstance(history, list) else {}
        self._write({"iteration": int(iteration), "loop": loop, "nodes": nodes,
                     "ledger": executor.ledger, "outcome": None, **appended})
        return True

    # ---- used by the Backend template -------------------------------------------------------
    def finished(self) -> dict[str, Any] | None:
        """The outcome of a run that had already finished when it was checkpointed."""
        if not self._loaded or self._loaded.get("outcome") is None:
            return None
        return self._decode(self._loaded["outcome"])

    def finish(self, outcome: dict[str, Any]) -> None:
        """Record the finished run (resuming it again returns this outcome)."""
        if self.path is None:
            return
        iteration = next(iter(outcome.get("iterations", {}).values()), 0)  # outer / rounds
        try:
            self._write({"iteration": iteration, "loop": None, "nodes": {}, "ledger": None,
                         "outcome": outcome})
        except (pickle.PicklingError, TypeError, AttributeError):
            pass  # an unpicklable extra in `info`: keep the last in-run checkpoint instead

    # ---- file format ----------------------------------------------------------------------
    def _write(self, payload: dict[str, Any]) -> None:
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "backend": self.backend, **payload}
        for key in ("loop", "nodes", "outcome"):
            data[key] = self._encode(data[key])
        atomic_write(self.path, data)
        self.saves += 1

    def _encode(self, obj):
        index = {uid: i for i, uid in enumerate(self._uids)}
        return _remap(obj, lambda keys: all(k in index for k in keys), lambda k: index[k], True)

    def _decode(self, obj):
        uids = self._uids
        return _remap(obj, None, lambda i: uids[i], False)


NO_CHECKPOINT = Checkpointer()


class _ByVariable(dict):
    """A dict whose keys were variable uids, stored by position in `problem.variables()`."""


def _remap(obj, match, key_map, encode: bool):
    """Copy of containers with dicts keyed by variable uid re-keyed (see the module docstring)."""
    if isinstance(obj, dict):
        items = {k: _remap(v, match, key_map, encode) for k, v in obj.items()}
        if encode and items and all(type(k) is int for k in items) and match(items) \
                and all(isinstance(v, np.ndarray) for v in items.values()):
            return _ByVariable({key_map(k): v for k, v in items.items()})
        if not encode and isinstance(obj, _ByVariable):
            return {key_map(k): v for k, v in items.items()}
        return items
    if isinstance(obj, list):
        return type(obj)(_remap(v, match, key_map, encode) for v in obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_remap(v, match, key_map, encode) for v in obj)
    return obj


def _check_writable(path: Path) -> None:
    """Refuse, before the run, a checkpoint whose directory does not take new files: the saves
    write a temporary file there and rename it over `path` (`atomic_write`), so that is what is
    probed — a permission test alone (os.access) would pass for root on a read-only mount."""
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {str(path)!r}: its directory "
                              f"{str(path.parent)!r} does not take new files ({exc.strerror}); "
                              "choose a writable directory or fix its permissions") from None
    os.close(fd)
    os.unlink(probe)


def atomic_write(path: str | os.PathLike, data: Any) -> None:
    """Pickle `data` to `path` atomically: temp file in the same directory, fsync, os.replace.
    On any error the temp file is removed and the previous file is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)   # make the rename itself durable (POSIX)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return          # e.g. Windows: directories cannot be opened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Unread:
    """Stands in for every fedmodel / backends class while a checkpoint's format is read: their
    state is not restored (an older file may name classes that have moved or changed)."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state) -> None:
        pass


class _FormatReader(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        # "backends": files of fedmodel before it installed only `fedmodel` (issue 26)
        if module.split(".")[0] in ("fedmodel", "backends"):
            return _Unread
        return super().find_class(module, name)


def _format_of(path: Path) -> Any:
    """The `format` a checkpoint file says it has (None when it cannot be read at all)."""
    try:
        with open(path, "rb") as f:
            data = _FormatReader(f).load()
    except Exception:  # noqa: BLE001 - not a checkpoint: the caller reports the original error
        return None
    return data.get("format") if isinstance(data, dict) else None


def _other_format(path: Path, written: Any) -> str:
    """Why a checkpoint of another format is refused."""
    age = "an older" if isinstance(written, int) and written < FORMAT else "another"
    return (f"checkpoint {str(path)!r} was written by {age} fedmodel version (checkpoint format "
            f"{written}; this version reads format {FORMAT}) and cannot be resumed: the node "
            "states it holds name modules and classes that have since moved. Start a fresh run "
            "(resume=False, or delete the file)")


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The raw content of a checkpoint file (for inspection and tests), its history records back
    in its loop state (`loop["history"]`)."""
    with open(path, "rb") as f:
        data = pickle.load(f)
    if isinstance(data, dict):
        join_history(data)
    return data
