"""Quantization: quantizers, quantized tensors, autocast and recipe state (docs/quantization.md).

The recipes themselves are in ``transformer_engine_cpp.recipe``.
"""

import torch

from .autocast import (FP8GlobalStateManager, autocast, fp8_autocast, fp8_model_init,
                       get_default_fp8_recipe, quantized_model_init)
from .quantizer import (Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer,
                        Quantizer)
from .role import QuantizerRole
from .recipe_state import (DelayedScalingRecipeState, Float8CurrentScalingRecipeState,
                           MXFP8BlockScalingRecipeState, NVFP4BlockScalingRecipeState,
                           RecipeState, get_fp8_max,
                           get_fp8_te_dtype, update_delayed_scaling)
from .nvfp4 import NVFP4Quantizer, NVFP4Tensor, NVFP4TensorStorage
from .tensor import (Float8Tensor, Float8TensorStorage, MXFP8Tensor, MXFP8TensorStorage,
                     QuantizedTensor, QuantizedTensorStorage)
from .fp8_block import (Float8BlockQuantizer, Float8BlockScalingRecipeState,
                        Float8BlockwiseQTensor, Float8BlockwiseQTensorStorage)
from ..constants import DType

# torch.load's default (weights_only=True) unpickles only allowlisted classes: a state_dict with
# quantized weights holds the tensor subclasses and, inside each tensor, its quantizer (as
# TransformerEngine allowlists its own). These classes rebuild from tensors and constants only.
torch.serialization.add_safe_globals([
    Float8Tensor, MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor,
    QuantizedTensorStorage, Float8TensorStorage, MXFP8TensorStorage,
    Float8BlockwiseQTensorStorage, NVFP4TensorStorage,
    Quantizer, Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer,
    Float8BlockQuantizer, NVFP4Quantizer, DType,
])

__all__ = [
    "FP8GlobalStateManager", "autocast", "fp8_autocast", "fp8_model_init",
    "get_default_fp8_recipe", "quantized_model_init", "Quantizer",
    "Float8CurrentScalingQuantizer", "Float8Quantizer", "MXFP8Quantizer", "RecipeState",
    "DelayedScalingRecipeState", "Float8CurrentScalingRecipeState",
    "MXFP8BlockScalingRecipeState", "get_fp8_max", "get_fp8_te_dtype", "update_delayed_scaling",
    "Float8Tensor", "Float8TensorStorage", "MXFP8Tensor", "MXFP8TensorStorage",
    "QuantizedTensor", "QuantizedTensorStorage", "QuantizerRole", "NVFP4Quantizer",
    "NVFP4Tensor", "NVFP4TensorStorage", "NVFP4BlockScalingRecipeState",
    "Float8BlockQuantizer", "Float8BlockScalingRecipeState", "Float8BlockwiseQTensor",
    "Float8BlockwiseQTensorStorage",
]
