"""Quantized tensors under TransformerEngine's module path (``transformer_engine.pytorch.tensor``):
``te.tensor.Float8Tensor`` and friends, defined in ``transformer_engine_cpp.quantization``."""

from ..quantization.tensor import (Float8Tensor, Float8TensorStorage, MXFP8Tensor,
                                   MXFP8TensorStorage, QuantizedTensor, QuantizedTensorStorage)

from ..quantization.fp8_block import (Float8BlockQuantizer, Float8BlockwiseQTensor,
                                      Float8BlockwiseQTensorStorage)

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensor", "Float8BlockwiseQTensorStorage",
           "Float8Tensor", "Float8TensorStorage", "MXFP8Tensor", "MXFP8TensorStorage",
           "QuantizedTensor", "QuantizedTensorStorage"]
