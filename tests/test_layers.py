"""The layers point only down (docs/architecture.md), read from the source with `ast`.

Every import counts: module level, inside functions, and under `TYPE_CHECKING` (a type-only
import still ties the lower module to the upper one). A module may import modules of its own
layer or a lower one, and the module graph has no cycle. The runtime names no algorithm, no
backend reads the IR's atoms, and backend modules stay the size of their algorithm boxes.
"""
from __future__ import annotations

import ast
import functools
import io
import pathlib
import re
import tokenize

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# folder -> the package it installs as (pyproject's package-dir: only `fedmodel` is installed)
PACKAGES = {"fedmodel": "fedmodel", "backends": "fedmodel.backends",
            "topologies": "fedmodel.topologies"}

# bottom to top; a module's layer is that of its longest matching prefix (a prefix covers
# itself and its submodules). There is no catch-all: the package's own `fedmodel/__init__` is
# listed alone in ROOT_MODULE, so a new top-level module lands in no layer until someone puts
# it in one (test_every_module_has_a_layer fails, and test_an_unlisted_module_is_reported checks
# that it can)
ROOT_MODULE = "fedmodel"
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fedmodel.errors", "fedmodel.registry", "fedmodel.collector")),
    ("model", ("fedmodel.expression", "fedmodel.analysis", "fedmodel.atoms", "fedmodel.constraints",
               "fedmodel.topologies")),
    ("compiler", ("fedmodel.compiler", "fedmodel.lowering")),
    ("problem", ("fedmodel.problem", "fedmodel.blocks", "fedmodel.result", "fedmodel.certificate",
                 "fedmodel.newton_distance",
                 "fedmodel.second_order", "fedmodel.solution_set", "fedmodel.never_met")),
    ("runtime", ("fedmodel.runtime",)),
    ("backends", ("fedmodel.backends",)),
    ("applications", (ROOT_MODULE, "fedmodel.verification", "fedmodel.verify_report", "fedmodel.plotting",
                      "fedmodel.builtin_models",
                      "fedmodel.reproductions", "fedmodel.cli", "fedmodel.deploy",
                      "fedmodel.datasets", "fedmodel.partitioners")),
]
ALGORITHM_WORDS = re.compile(r"dald|admm|proxal|fedprox|fedavg|insa|dgd", re.IGNORECASE)


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package,) + (parts[:-1] if parts[-1] == "__init__" else parts))
            mods[name] = path
    return mods


MODULES = _modules()


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    """The parsed source of `path`, parsed once: the graph, the algorithm-word and the
    dynamic-import tests read the same ~150 files (parsing them was 2.6 s of this file's 3.7)."""
    return ast.parse(path.read_text())


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_resolve(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                found.add(_resolve(f"{target}.{alias.name}") or _resolve(target))
    found.discard(None)
    found.discard(module)
    return found


def _covers(prefix: str, module: str) -> bool:
    """`prefix` names `module` or a package above it; the root package names only itself."""
    if prefix == ROOT_MODULE:
        return module == ROOT_MODULE
    return module == prefix or module.startswith(prefix + ".")


def _find_layer(module: str) -> int | None:
    """Index in LAYERS of the longest prefix covering `module`, None when none does."""
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _covers(prefix, module) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def _layer(module: str) -> int:
    rank = _find_layer(module)
    assert rank is not None, f"{module} is in no layer; add it to LAYERS"
    return rank


def _unlayered(modules) -> list[str]:
    return sorted(m for m in modules if _find_layer(m) is None)


@functools.cache
def _graph() -> nx.DiGraph:
    """The import graph of MODULES, built on first use (not at collection, which every xdist
    worker pays)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((m, t) for m in MODULES for t in _imports(m))
    return graph


def test_every_module_has_a_layer():
    missing = _unlayered(MODULES)
    assert not missing, f"modules in no layer (add each to LAYERS): {missing}"


def test_an_unlisted_module_is_reported():
    """The test of the test: a new top-level module, or one in a folder no prefix names, is in
    no layer (the root package `fedmodel` covers only its own __init__), while listed packages
    still cover their new submodules."""
    invented = ["fedmodel.brand_new_module", "fedmodel.newpackage.part", "fedmodelx",
                "fedmodel.runtime.brand_new_module", "fedmodel.backends.newalgo.client"]
    assert _unlayered(invented) == ["fedmodel.brand_new_module", "fedmodel.newpackage.part",
                                    "fedmodelx"]
    assert _find_layer(ROOT_MODULE) == len(LAYERS) - 1
    with pytest.raises(AssertionError, match="fedmodel.brand_new_module is in no layer"):
        _layer("fedmodel.brand_new_module")


def test_no_upward_import():
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
              for m, t in _graph().edges if _layer(t) > _layer(m)]
    assert not upward, "imports that point up:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    cycles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def _code_without_comments_and_docstrings(path: pathlib.Path) -> str:
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add(body[0].lineno)
    kept = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            continue
        if token.type == tokenize.STRING and token.start[0] in docstrings:
            continue
        kept.append(token.string)
    return " ".join(kept)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("fedmodel.runtime")))
def test_runtime_names_no_algorithm(module):
    words = sorted(set(ALGORITHM_WORDS.findall(_code_without_comments_and_docstrings(MODULES[module]))))
    assert not words, f"{module} names algorithms in its code: {words}"


def test_no_backend_reads_the_atoms():
    readers = [f"{m} imports {t}" for m, t in _graph().edges
               if m.startswith("fedmodel.backends") and t.startswith("fedmodel.atoms")]
    assert not readers, "\n".join(readers)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("fedmodel.backends")))
def test_backend_modules_are_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 400, f"{module} has {lines} lines; split it by concept"


FLOWER = "fedmodel.runtime.flower."


def test_the_flower_rooms_import_downwards():
    """The Flower executor split by job (issue 26, item 4): the codec imports no other room,
    SecAgg+, the driver's node membership and its timings only the codec (or nothing), the
    ClientApp never the driver (a SuperNode loads no server code), nor does the node process
    that runs the ClientApp (issue 27, item 4) or the simulation engine that starts ClientApps,
    and no module imports the former `flower_executor` (kept as a re-export for old imports)."""
    rooms = {m[len(FLOWER):]: sorted(t[len(FLOWER):] for t in _graph().successors(m) if t.startswith(FLOWER))
             for m in MODULES if m.startswith(FLOWER)}
    assert rooms == {"codec": [], "secagg": ["codec"], "client_app": ["codec", "secagg"],
                     "node_process": ["client_app"], "simulation": ["client_app"],
                     "membership": ["codec"], "timings": [],
                     "driver": ["codec", "membership", "secagg", "simulation", "timings"]}
    assert list(_graph().predecessors("fedmodel.runtime.flower_executor")) == []


# Dynamic imports whose module name is not a literal: each one here is reviewed, with why its
# name comes from a fixed table or from this host's own configuration (never from a message,
# a file or anything received). (module, enclosing function) -> why.
DYNAMIC_IMPORTS = {
    ("fedmodel", "__getattr__"): "the lazy table of fedmodel/__init__ (literal module names)",
    ("fedmodel.reproductions", "run"): "REPRODUCTIONS' table of literal module names",
    ("fedmodel.deploy.app", "_solve"): "the generated app's own package (APP_PACKAGE, a constant)",
    ("fedmodel.runtime.flower.client_app", "load_client_modules"):
        "the client host's FEDMODEL_CLIENT_MODULES (its own environment, never a message)",
}


def _dynamic_imports(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of each `import_module(...)` / `__import__(...)` call of
    a file whose module name is not a string literal."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                literal = bool(child.args) and isinstance(child.args[0], ast.Constant) and \
                    isinstance(child.args[0].value, str)
                if name in ("import_module", "__import__") and not literal:
                    found.append((function, child.lineno, ast.unparse(child)[:80]))
            visit(child, inner)
    visit(_tree(path), "<module>")
    return found


def test_no_dynamic_import_of_a_name_from_outside(tmp_path):
    """No module imports a name it computed (a module name sent by a server was imported by
    Flower clients before issue 26), except the reviewed calls of DYNAMIC_IMPORTS; and the
    check itself flags such a call (a test of the test)."""
    calls = {m: _dynamic_imports(MODULES[m]) for m in sorted(MODULES)}     # (one walk each)
    flagged = [f"{m}:{line} in {function}(): {call}" for m in calls
               for function, line, call in calls[m] if (m, function) not in DYNAMIC_IMPORTS]
    assert not flagged, "dynamic imports of computed names:\n" + "\n".join(flagged)
    used = {(m, f) for m in calls for f, _, _ in calls[m]}
    assert set(DYNAMIC_IMPORTS) <= used, f"stale entries: {set(DYNAMIC_IMPORTS) - used}"
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib\n\ndef serve(meta):\n    importlib.import_module(meta['module'])\n"
                     "    __import__('os')\n    __import__(meta['name'])\n")
    assert [(f, line) for f, line, _ in _dynamic_imports(probe)] == [("serve", 4), ("serve", 6)]
