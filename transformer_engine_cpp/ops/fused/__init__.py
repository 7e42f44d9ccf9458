"""Fused operations. Importing this module registers the built-in fusions."""

from ..fuser import (
    register_backward_fusion,
    register_forward_backward_fusion,
    register_forward_fusion,
)
from .backward_activation_bias import BackwardActivationBias, fuse_backward_activation_bias
from .backward_add_rmsnorm import BackwardAddRMSNorm, fuse_backward_add_rmsnorm

# The anchor's registration order.
register_backward_fusion(fuse_backward_activation_bias)
register_backward_fusion(fuse_backward_add_rmsnorm)
