"""fedmodel: write a federated optimization model once, algebraically; solve it on any topology
with the field's algorithms; verify it against an exact centralized solve.

    import fedmodel as fm
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0"); X = c.data(X0, name="X0")
    c.minimize(fm.mean(fm.logistic(X @ w)))
    res = prob.solve("cvxpy")

Heavy dependencies (cvxpy, sympy, ray, matplotlib) are imported only when used.
"""
from .errors import (CurvatureError, DataError, FedModelError, ShapeError, SmoothnessError,
                     TopologyError)
from .expression import BroadcastWarning, Constant, Data, Expression, Parameter, Variable
from .constraints import Constraint, Equality, Inequality
from .atoms import (abs, exp, hstack, huber, log, log_sum_exp, logistic, maximum, mean, multiply,
                    norm1, norm2, norm_inf, pos, power, quad_form, reshape, sqrt, square, sum,
                    sum_squares, transpose, vstack)
from .compiler.differentiate import grad, vjp
from .compiler.codegen import Plan
from .lowering import to_cvxpy, to_sympy

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy submodules and the objects that live in them (keeps `import fedmodel` fast).
    import importlib
    lazy = {
        "Problem": ("fedmodel.problem", "Problem"),
        "Client": ("fedmodel.blocks", "Client"),
        "Server": ("fedmodel.blocks", "Server"),
        "Result": ("fedmodel.result", "Result"),
        "verify": ("fedmodel.verification", "verify"),
        "Report": ("fedmodel.verify_report", "Report"),
        "plot": ("fedmodel.plotting", "plot"),
        "render": ("fedmodel.problem", "render"),
        "compile": ("fedmodel.compiler.codegen", "Plan"),
        "topologies": ("fedmodel.topologies", None),
        "backends": ("fedmodel.backends", None),
        "datasets": ("fedmodel.datasets", None),
    }
    if name in lazy:
        module_name, attr = lazy[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedmodel' has no attribute {name!r}")
