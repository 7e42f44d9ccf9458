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
)
from .add_extra_input import AddExtraInput
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .identity import Identity
from .l2normalization import L2Normalization
from .layer_norm import LayerNorm
from .make_extra_output import MakeExtraOutput
from .quantize import Quantize
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
    "AddExtraInput", "BasicLinear", "Bias", "ClampedSwiGLU", "ConstantScale", "Dropout", "GEGLU",
    "GELU", "GLU", "Identity", "L2Normalization", "LayerNorm", "MakeExtraOutput", "QGEGLU",
    "QGELU", "Quantize", "ReGLU", "ReLU", "Reshape", "RMSNorm", "ScaledClampedQGeGLU",
    "ScaledSiTUGLU", "ScaledSReLU", "ScaledSwiGLU", "SiLU",
    "SiTUGLU", "SReGLU", "SReLU", "SwiGLU",
]
