"""Atoms of the IR. Each atom is one class that knows its math (shape, value, derivative,
curvature, sign, smoothness, prox); the lower-case functions are the public constructors.
How atoms lower to CVXPY and sympy is in `fedmodel.lowering`."""
from ..expression import OPERATORS
from .arithmetic import Add, Multiply, Neg, add, multiply, neg
from .base import Atom
from .broadcasting import BroadcastTo, SumTo, broadcast_to, sum_to
from .elementwise import (Abs, Clip, Exp, Huber, Log, Logistic, Pos, Power, Sigmoid, Sign, Sqrt,
                          Square, Step, abs, divide, exp, huber, log, logistic, pos, power, sqrt,
                          square)
from .indexing import Index, IndexAdjoint, index
from .linear import MatMul, Reshape, Transpose, matmul, reshape, transpose
from .maximum import GreaterEqual, Maximum, maximum
from .stacking import hstack, vstack
from .reductions import (ArgmaxAbs, LogSumExp, Norm1, Norm2, NormInf, QuadForm, Softmax,
                         SumSquares, log_sum_exp, norm1, norm2, norm_inf, quad_form, sum_squares)
from .sums import Mean, Sum, mean, sum
# the public power and square: ‖a‖₂ ** 2 and square(norm2(a)) are sum_squares(a) (smooth)
from .reductions import power_or_squares as power, square_or_squares as square  # noqa: E402, F811

PUBLIC = ["sum", "mean", "multiply", "square", "sum_squares", "quad_form", "norm1", "norm2",
          "norm_inf", "abs", "exp", "log", "sqrt", "power", "logistic", "log_sum_exp", "pos",
          "maximum", "huber", "reshape", "transpose"]     # atoms; hstack / vstack compose them

# the operators of `Expression` build these atoms (fedmodel/expression.py)
OPERATORS.update(add=add, neg=neg, multiply=multiply, divide=divide,
                 matmul=matmul, power=power, index=index, transpose=transpose)
