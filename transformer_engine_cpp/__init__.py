"""transformer_engine_cpp: TransformerEngine's fusible operations (``te.ops``) as PyTorch C++
custom ops. CPU kernels today; the build has a CUDA path for the CUDA kernels to come.

    import transformer_engine_cpp as te
    model = te.ops.Sequential(te.ops.Bias(64), te.ops.GELU())
"""

import torch  # loads libtorch before the extension

from . import _C  # noqa: F401  (registers torch.ops.te_cpp.*)
from . import ops
from . import recipe, tensor
from . import common  # transformer_engine.common.recipe's path
from ._te_names import module_getattr as __getattr__  # TransformerEngine names not provided
from .constants import DType
from .quantization import (Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor,
                           MXFP8Quantizer, MXFP8Tensor, QuantizedTensor, QuantizerRole, autocast,
                           fp8_autocast, fp8_model_init, get_default_fp8_recipe,
                           quantized_model_init)
from .quantization.nvfp4 import NVFP4Quantizer, NVFP4Tensor
from .quantization.fp8_block import Float8BlockQuantizer, Float8BlockwiseQTensor
from .ops import _torch_shim

__version__ = "0.1.0"

# te_cpp.random_seeds draws from torch's generator: an ordered effect, so that torch.compile
# keeps every draw, in program order (AOTAutograd's CSE looks at its own list of random ops,
# not at the op's nondeterministic_seeded tag, and would merge two draws of equal arguments).
_torch_shim.register_ordered_effect(torch.ops.te_cpp.random_seeds.default)


def built_with_cuda() -> bool:
    """Whether the extension was built with the CUDA toolchain (csrc/kernels/cuda/)."""
    return _C.built_with_cuda()


_FP8_REASON = "emulated on CPU (torch.float8_e4m3fn / torch.float8_e5m2 conversions)"


def is_fp8_available(return_reason: bool = False):
    """FP8 (per-tensor scaling) is available everywhere through CPU emulation."""
    return (True, _FP8_REASON) if return_reason else True


def is_mxfp8_available(return_reason: bool = False):
    """MXFP8 (32-element blocks, E8M0 scales) is available everywhere through CPU emulation."""
    return (True, _FP8_REASON) if return_reason else True


def get_default_recipe():
    """The recipe ``te.autocast()`` uses without one (TransformerEngine's name):
    Float8CurrentScaling here."""
    return get_default_fp8_recipe()


_NVFP4_REASON = ("emulated on CPU (E2M1 values packed two per byte, E4M3 block scales, "
                 "te_cpp.nvfp4_quantize / nvfp4_dequantize)")


def is_nvfp4_available(return_reason: bool = False):
    """NVFP4 (16-element blocks, E4M3 and per-tensor scales) is available everywhere through
    CPU emulation."""
    return (True, _NVFP4_REASON) if return_reason else True


def is_fp8_block_scaling_available(return_reason: bool = False):
    """Float8BlockScaling (1x128 / 128x128 blocks, fp32 scales) is available everywhere through
    CPU emulation."""
    return (True, _FP8_REASON) if return_reason else True


def is_bf16_available() -> bool:
    """bfloat16 compute is supported by every kernel of this extension."""
    return True


__all__ = ["ops", "recipe", "common", "built_with_cuda", "__version__", "autocast", "fp8_autocast",
           "quantized_model_init", "fp8_model_init", "QuantizedTensor", "Float8Tensor",
           "MXFP8Tensor", "Float8Quantizer", "Float8CurrentScalingQuantizer", "MXFP8Quantizer",
           "is_fp8_available", "is_mxfp8_available", "is_bf16_available", "DType",
           "QuantizerRole", "get_default_recipe", "NVFP4Quantizer", "NVFP4Tensor",
           "is_nvfp4_available", "is_fp8_block_scaling_available", "Float8BlockQuantizer",
           "Float8BlockwiseQTensor"]
