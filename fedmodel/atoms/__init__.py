"""Atoms of the IR. Each atom is one class (value, derivative, curvature, sign, smoothness,
lowerings, prox); the lower-case functions are the public constructors."""
from .affine import (Add, BroadcastTo, Index, IndexAdjoint, MatMul, Mean, Multiply, Neg, Reshape,
                     Sum, SumTo, Transpose, add, broadcast_to, divide, index, matmul, mean,
                     multiply, neg, reshape, scalar_or_elementwise_mul, sum, sum_to, transpose)
from .base import Atom
from .elementwise import (Abs, Clip, Exp, GreaterEqual, Huber, Log, Logistic, Maximum, Pos, Power,
                          Sigmoid, Sign, Sqrt, Square, Step, abs, exp, huber, log, logistic,
                          maximum, pos, power, sqrt, square)
from .reductions import (ArgmaxAbs, LogSumExp, Norm1, Norm2, NormInf, QuadForm, Softmax,
                         SumSquares, log_sum_exp, norm1, norm2, norm_inf, quad_form, sum_squares)

PUBLIC = ["sum", "mean", "multiply", "square", "sum_squares", "quad_form", "norm1", "norm2",
          "norm_inf", "abs", "exp", "log", "sqrt", "power", "logistic", "log_sum_exp", "pos",
          "maximum", "huber", "reshape", "transpose"]
