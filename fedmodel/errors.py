"""Errors raised for bad input (docs/api.md §6). All derive from FedModelError, a ValueError."""


class FedModelError(ValueError):
    """Base class: bad input to fedmodel. The message says what, where and how to fix it."""


class ShapeError(FedModelError):
    """Incompatible shapes in an expression or a constraint."""


class DataError(FedModelError):
    """Non-finite or non-numeric data, an empty client, a missing dataset file."""


class CurvatureError(FedModelError):
    """A backend or CVXPY needs convexity the model lacks."""


class SmoothnessError(FedModelError):
    """A nonsmooth term where a gradient is needed and no prox exists."""


class TopologyError(FedModelError):
    """Disconnected graph, missing server, nodes that match no client."""
