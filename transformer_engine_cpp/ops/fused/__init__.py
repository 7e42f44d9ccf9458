"""Fused operations. Importing this module registers the built-in fusions, in the anchor's
order (earlier registrations match first)."""

from ..fuser import (
    register_backward_fusion,
    register_forward_backward_fusion,
    register_forward_fusion,
)
from .backward_activation_bias import BackwardActivationBias, fuse_backward_activation_bias
from .backward_add_rmsnorm import BackwardAddRMSNorm, fuse_backward_add_rmsnorm
from .backward_linear import (BackwardLinearAdd, BackwardLinearBias, BackwardLinearScale,
                              fuse_backward_linear_add, fuse_backward_linear_bias,
                              fuse_backward_linear_scale)
from .forward_bias_activation import ForwardBiasActivation, fuse_forward_bias_activation
from .forward_linear import (ForwardLinearBiasActivation, ForwardLinearBiasAdd,
                             ForwardLinearScaleAdd, fuse_forward_linear_bias_activation,
                             fuse_forward_linear_bias_add, fuse_forward_linear_scale_add)

register_forward_fusion(fuse_forward_linear_bias_add)
register_forward_fusion(fuse_forward_linear_bias_activation)
register_forward_fusion(fuse_forward_linear_scale_add)
# after the linear ones: [BasicLinear, Bias, act] stays a ForwardLinearBiasActivation
register_forward_fusion(fuse_forward_bias_activation)
register_backward_fusion(fuse_backward_linear_add)
register_backward_fusion(fuse_backward_linear_scale)
register_backward_fusion(fuse_backward_activation_bias)
register_backward_fusion(fuse_backward_add_rmsnorm)
# last: a Bias already claimed by an activation (or a linear by a scale or add) stays there
register_backward_fusion(fuse_backward_linear_bias)

__all__ = [
    "BackwardActivationBias", "BackwardAddRMSNorm", "BackwardLinearAdd", "BackwardLinearBias",
    "BackwardLinearScale",
    "ForwardBiasActivation",
    "ForwardLinearBiasActivation", "ForwardLinearBiasAdd", "ForwardLinearScaleAdd",
    "register_backward_fusion", "register_forward_backward_fusion", "register_forward_fusion",
]
