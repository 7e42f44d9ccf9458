"""Basic operations."""

from .activation import (
    GEGLU,
    GELU,
    GLU,
    QGEGLU,
    QGELU,
    ReGLU,
    ReLU,
    ScaledSReLU,
    SiLU,
    SReGLU,
    SReLU,
    _ActivationOperation,
    _ScaledActivation,
)
from .add_extra_input import AddExtraInput
from .all_gather import AllGather
from .all_reduce import AllReduce
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .grouped_linear import GroupedLinear
from .identity import Identity
from .l2normalization import L2Normalization
from .layer_norm import LayerNorm
from .make_extra_output import MakeExtraOutput
from .quantize import Quantize
from .reduce_scatter import ReduceScatter
from .reshape import Reshape
from .rmsnorm import RMSNorm
from .swiglu import (
    ClampedSwiGLU,
    ScaledClampedQGeGLU,
    ScaledSiTUGLU,
    ScaledSwiGLU,
    SiTUGLU,
    SwiGLU,
)

__all__ = [
    "AddExtraInput", "AllGather", "AllReduce", "BasicLinear", "Bias", "ClampedSwiGLU",
    "ConstantScale", "Dropout", "GEGLU", "GELU", "GLU", "GroupedLinear", "Identity",
    "L2Normalization", "LayerNorm", "MakeExtraOutput", "QGEGLU", "QGELU", "Quantize",
    "ReduceScatter", "ReGLU", "ReLU", "Reshape", "RMSNorm", "ScaledClampedQGeGLU", "ScaledSiTUGLU",
    "ScaledSReLU", "ScaledSwiGLU", "SiLU", "SiTUGLU", "SReGLU", "SReLU", "SwiGLU",
]


def _subclasses(cls):
    for sub in cls.__subclasses__():  # in definition order
        yield sub
        yield from _subclasses(sub)


#: The activation table: every public activation class of this package (unary, gated, then
#: scaled), in definition order. Each class declares its kernels as class attributes (see
#: ``_ActivationOperation``); the fusion tables of ops/fused and the tests' activation lists are
#: computed from this tuple, and tests/test_activation_table.py checks the C++ kernels and
#: docs/ops.md's activation table against it.
ACTIVATIONS = tuple(
    cls
    for base in (_ActivationOperation, _ScaledActivation)
    for cls in _subclasses(base)
    if not cls.__name__.startswith("_") and cls.__module__.startswith(__name__ + ".")
)
