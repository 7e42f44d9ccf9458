"""Quantized tensors under TransformerEngine's module path (``transformer_engine.pytorch.tensor``):
``te.tensor.Float8Tensor`` and friends, defined in ``transformer_engine_cpp.quantization``."""

from ..quantization.tensor import (Float8Tensor, Float8TensorStorage, MXFP8Tensor,
                                   MXFP8TensorStorage, QuantizedTensor, QuantizedTensorStorage)

__all__ = ["Float8Tensor", "Float8TensorStorage", "MXFP8Tensor", "MXFP8TensorStorage",
           "QuantizedTensor", "QuantizedTensorStorage"]
