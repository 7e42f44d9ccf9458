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
from .extra_tensors import AddExtraInput, MakeExtraOutput
from .identity import Identity, Reshape
from .normalization import LayerNorm, RMSNorm

__all__ = [
    "AddExtraInput", "BasicLinear", "Bias", "ClampedSwiGLU", "ConstantScale", "GEGLU", "GELU", "GLU",
    "Identity", "LayerNorm", "MakeExtraOutput", "QGEGLU", "QGELU", "ReGLU", "ReLU", "Reshape", "RMSNorm", "SiLU",
    "SiTUGLU", "SReGLU", "SReLU", "SwiGLU",
]
