"""Basic operations."""

from .activation import (
    GEGLU,
    GELU,
    GLU,
    QGEGLU,
    QGELU,
    ClampedSwiGLU,
    ReGLU,
    ReLU,
    SiLU,
    SiTUGLU,
    SReGLU,
    SReLU,
    SwiGLU,
)
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .extra_tensors import AddExtraInput, MakeExtraOutput
from .identity import Identity, Reshape
from .normalization import LayerNorm, RMSNorm
from .quantize import Quantize
from .l2normalization import L2Normalization
from .scaled_activation import ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU

__all__ = [
    "AddExtraInput", "BasicLinear", "Bias", "ClampedSwiGLU", "ConstantScale", "Dropout", "GEGLU",
    "GELU", "GLU", "Identity", "L2Normalization", "LayerNorm", "MakeExtraOutput", "QGEGLU",
    "QGELU", "Quantize", "ReGLU", "ReLU", "Reshape", "RMSNorm", "ScaledClampedQGeGLU", "ScaledSiTUGLU",
    "ScaledSReLU", "ScaledSwiGLU", "SiLU",
    "SiTUGLU", "SReGLU", "SReLU", "SwiGLU",
]
