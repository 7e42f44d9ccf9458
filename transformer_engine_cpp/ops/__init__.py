"""Fusible operations (TransformerEngine's ``transformer_engine.pytorch.ops``)."""

from . import fused
from .basic import *  # noqa: F401,F403
from .basic import __all__ as _basic_all  # type: ignore[attr-defined]
from .fuser import (
    OperationFuser,
    register_backward_fusion,
    register_forward_backward_fusion,
    register_forward_fusion,
)
from .linear import Linear
from .op import BasicOperation, FusedOperation, FusibleOperation, OperationContext
from .sequential import Sequential


def __getattr__(name: str):
    # CompileUnsupportedError is defined on first use (see op.compile_unsupported_error)
    if name == "CompileUnsupportedError":
        return op.compile_unsupported_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
