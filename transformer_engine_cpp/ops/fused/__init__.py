"""Fused operations. Importing this module registers the built-in fusions.

Two phases, so that a user's fusion function sees the ops TransformerEngine would show it:

* the fusions TransformerEngine has, with its conditions, registered in its order (earlier
  registrations match first); fusion functions registered later by users run after them;
* our extensions (no TransformerEngine counterpart, or wider conditions: the grouped MLP on
  every device, activations in the linear epilogue, Bias+activation, the functional residual adds, BackwardActivationBias
  without a recipe, BackwardLinearBias), which the fuser applies after every registered one.
"""

from ..fuser import (
    OperationFuser,
    register_backward_fusion,
    register_forward_backward_fusion,
    register_forward_fusion,
)
from .backward_activation_bias import (BackwardActivationBias, extend_backward_activation_bias,
                                       fuse_backward_activation_bias)
from .backward_add_rmsnorm import BackwardAddRMSNorm, fuse_backward_add_rmsnorm
from .backward_linear_add import (BackwardLinearAdd, extend_backward_linear_add,
                                  fuse_backward_linear_add)
from .backward_linear_bias import BackwardLinearBias, extend_backward_linear_bias
from .backward_linear_scale import BackwardLinearScale, fuse_backward_linear_scale
from .forward_bias_activation import ForwardBiasActivation, extend_forward_bias_activation
from .forward_linear_bias_activation import (ForwardLinearBiasActivation,
                                             extend_forward_linear_bias_activation,
                                             fuse_forward_linear_bias_activation)
from .forward_linear_bias_add import (ForwardLinearBiasAdd, extend_forward_linear_bias_add,
                                      fuse_forward_linear_bias_add)
from .forward_linear_scale_add import (ForwardLinearScaleAdd, extend_forward_linear_scale_add,
                                       fuse_forward_linear_scale_add)
from .grouped_mlp import GroupedMLP, fuse_grouped_mlp

register_forward_fusion(fuse_forward_linear_bias_add)
register_forward_fusion(fuse_forward_linear_bias_activation)
register_forward_fusion(fuse_forward_linear_scale_add)
register_backward_fusion(fuse_backward_linear_add)
register_backward_fusion(fuse_backward_linear_scale)
register_backward_fusion(fuse_backward_activation_bias)
register_backward_fusion(fuse_backward_add_rmsnorm)

# The extensions, in order: the residual adds before the epilogue activations (as the
# registered ones), the linear ones before Bias+activation (so [BasicLinear, Bias, act] stays
# one GEMM with its epilogue), BackwardLinearBias last (a Bias claimed by an activation, or a
# linear by an add, stays there).
OperationFuser.extension_forward_backward_fusion_functions = (fuse_grouped_mlp,)
OperationFuser.extension_forward_fusion_functions = (
    extend_forward_linear_bias_add,
    extend_forward_linear_bias_activation,
    extend_forward_linear_scale_add,
    extend_forward_bias_activation,
)
OperationFuser.extension_backward_fusion_functions = (
    extend_backward_linear_add,
    extend_backward_activation_bias,
    extend_backward_linear_bias,
)

__all__ = [
    "BackwardActivationBias", "BackwardAddRMSNorm", "BackwardLinearAdd", "BackwardLinearBias",
    "BackwardLinearScale",
    "ForwardBiasActivation",
    "ForwardLinearBiasActivation", "ForwardLinearBiasAdd", "ForwardLinearScaleAdd", "GroupedMLP",
    "register_backward_fusion", "register_forward_backward_fusion", "register_forward_fusion",
]
