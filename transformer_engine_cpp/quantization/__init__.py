"""Quantization: quantizers, quantized tensors, autocast and recipe state (docs/quantization.md).

The recipes themselves are in ``transformer_engine_cpp.recipe``.
"""

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
