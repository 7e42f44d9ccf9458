"""Per-op quantization state built from a recipe (te_ops.md 4.2, 4.4).

``RecipeState.create(recipe, mode=..., num_quantizers=n, roles=...)`` returns the state for one
op and one direction, and ``state.make_quantizers()`` builds its ``n`` quantizers. Quantizer i
serves the tensor ``state.tensor_type(i)``: its role's ``tensor_type`` when the op declares
roles (``QuantizerRole``, as TransformerEngine's ops do), else by position as in
TransformerEngine ("forward": input, weight, output, repeating; "backward": grad_output,
grad_input). ``update_delayed_scaling(state)`` is
delayed scaling's update rule.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import recipe as _recipe
from .nvfp4 import FP4_DTYPE, NVFP4Quantizer
from .quantizer import Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer

__all__ = ["get_fp8_te_dtype", "get_fp8_max", "RecipeState", "DelayedScalingRecipeState",
           "Float8CurrentScalingRecipeState", "MXFP8BlockScalingRecipeState",
           "NVFP4BlockScalingRecipeState", "update_delayed_scaling"]

_MODES = ("forward", "backward")
#: the tensor types a role may name, and the positional ones used without a role
_TENSOR_TYPES = ("input", "weight", "output", "grad_output", "grad_input")
_POSITIONAL = {"forward": ("input", "weight", "output"), "backward": ("grad_output", "grad_input")}


def get_fp8_te_dtype(recipe, fprop_tensor: bool = True) -> torch.dtype:
    """E4M3 if the format is E4M3, or HYBRID for a forward-pass tensor; E5M2 otherwise."""
    if recipe.fp8_format == _recipe.Format.E4M3 or (
            recipe.fp8_format == _recipe.Format.HYBRID and fprop_tensor):
        return torch.float8_e4m3fn
    return torch.float8_e5m2


def get_fp8_max(recipe, fprop_tensor: bool = True) -> float:
    return recipe.fp8_format.max_fwd if fprop_tensor else recipe.fp8_format.max_bwd


class RecipeState:
    """Quantization state of one op for one recipe and one mode."""

    recipe = None
    mode = None
    num_quantizers = 0

    @staticmethod
    def create(recipe, *, mode: str, num_quantizers: int = 1, device=None,
               roles=None) -> "RecipeState":
        if mode not in _MODES:
            raise ValueError(f"RecipeState: mode must be 'forward' or 'backward', got {mode!r}")
        if not isinstance(num_quantizers, int) or num_quantizers < 0:
            raise ValueError(f"RecipeState: num_quantizers must be an int >= 0, got "
                             f"{num_quantizers!r}")
        if isinstance(recipe, _recipe.DelayedScaling):
            cls = DelayedScalingRecipeState
        elif isinstance(recipe, _recipe.Float8CurrentScaling):
            cls = Float8CurrentScalingRecipeState
        elif isinstance(recipe, _recipe.MXFP8BlockScaling):
            cls = MXFP8BlockScalingRecipeState
        elif isinstance(recipe, _recipe.NVFP4BlockScaling):
            cls = NVFP4BlockScalingRecipeState
        elif isinstance(recipe, _recipe.Float8BlockScaling):
            from .fp8_block import Float8BlockScalingRecipeState as cls  # imports this module
        else:
            raise ValueError(f"RecipeState: unsupported recipe {recipe!r}")
        if roles is not None and len(roles) != num_quantizers:
            raise ValueError(f"RecipeState: got {len(roles)} roles for {num_quantizers} "
                             "quantizers")
        return cls(recipe, mode=mode, num_quantizers=num_quantizers, device=device, roles=roles)

    def __init__(self, recipe, *, mode, num_quantizers, device=None, roles=None):
        self.recipe = recipe
        self.mode = mode
        self.num_quantizers = num_quantizers
        self.roles = None if roles is None else list(roles)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.dtype = (FP4_DTYPE if isinstance(recipe, _recipe.NVFP4BlockScaling)
                      else get_fp8_te_dtype(recipe, mode == "forward"))

    def make_quantizers(self) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def tensor_type(self, index: int) -> str:
        """The tensor quantizer ``index`` serves: its role's ``tensor_type`` when that names
        one of input, weight, output, grad_output, grad_input; otherwise by position."""
        role = None if self.roles is None else self.roles[index]
        if role is not None and role.tensor_type in _TENSOR_TYPES:
            return role.tensor_type
        positional = _POSITIONAL[self.mode]
        return positional[index % len(positional)]


class DelayedScalingRecipeState(RecipeState):
    """``scale`` (n,) starts at 1; ``amax_history`` (amax_history_len, n) starts at 0.
    Quantizer i casts with ``scale[i]`` and records into ``amax_history[0, i]``."""

    def __init__(self, recipe, *, mode, num_quantizers, device=None, roles=None):
        super().__init__(recipe, mode=mode, num_quantizers=num_quantizers, device=device,
                         roles=roles)
        # normal tensors even when first built inside torch.inference_mode: training updates
        # them in place later
        with torch.inference_mode(False):
            self.scale = torch.ones(num_quantizers, dtype=torch.float32, device=self.device)
            self.amax_history = torch.zeros(recipe.amax_history_len, num_quantizers,
                                            dtype=torch.float32, device=self.device)
        #: the process group the amaxes are reduced over before an update (te.autocast's
        #: amax_reduction_group when the op last ran, recorded by the op; None: the world)
        self.amax_reduction_group = None

    def make_quantizers(self) -> list:
        return [Float8Quantizer(self.scale[i:i + 1], self.amax_history[0, i:i + 1], self.dtype)
                for i in range(self.num_quantizers)]


class Float8CurrentScalingRecipeState(RecipeState):
    """Quantizer per role: force_pow_2_scales = recipe.use_power_2_scales; amax_epsilon from
    the role's QParams (forward: the weight's for weights, the input's otherwise; backward:
    grad)."""

    def make_quantizers(self) -> list:
        r = self.recipe
        out = []
        for i in range(self.num_quantizers):
            if self.mode == "backward":
                qp = r.fp8_quant_bwd_grad
            else:
                qp = (r.fp8_quant_fwd_weight if self.tensor_type(i) == "weight"
                      else r.fp8_quant_fwd_inp)
            out.append(Float8CurrentScalingQuantizer(
                self.dtype, force_pow_2_scales=r.use_power_2_scales,
                amax_epsilon=qp.amax_epsilon))
        return out


class MXFP8BlockScalingRecipeState(RecipeState):
    def make_quantizers(self) -> list:
        return [MXFP8Quantizer(self.dtype) for _ in range(self.num_quantizers)]


class NVFP4BlockScalingRecipeState(RecipeState):
    """Quantizer per role from the recipe's QParams, as TransformerEngine: forward weights
    fp4_quant_fwd_weight, inputs and outputs fp4_quant_fwd_inp; backward fp4_quant_bwd_grad."""

    def make_quantizers(self) -> list:
        r = self.recipe
        out = []
        for i in range(self.num_quantizers):
            if self.mode == "backward":
                qp = r.fp4_quant_bwd_grad
            else:
                qp = (r.fp4_quant_fwd_weight if self.tensor_type(i) == "weight"
                      else r.fp4_quant_fwd_inp)
            out.append(NVFP4Quantizer(
                FP4_DTYPE, with_rht=qp.random_hadamard_transform,
                with_post_rht_amax=qp.random_hadamard_transform,
                with_2d_quantization=qp.fp4_2d_quantization,
                stochastic_rounding=qp.stochastic_rounding))
        return out


@torch.no_grad()
def update_delayed_scaling(state: DelayedScalingRecipeState) -> None:
    """Delayed scaling's update (te_ops.md 4.4), in place on ``state.scale`` and
    ``state.amax_history``:

    * with ``recipe.reduce_amax`` and torch.distributed initialized, the newest amaxes
      (slot 0) are first maximised over ``state.amax_reduction_group`` (the world when None);
    * amax = max over the history ("max") or its slot 0 ("most_recent"), or
      ``amax_compute_algo(amax_history)`` for a callable;
    * the history is rolled by one (``torch.roll(h, -1, 0)``) and slot 0 zeroed;
    * sf = (fp8_max / amax) / 2**margin in fp32, fp8_max of the state's mode; the old scale is
      kept where amax <= 0 or amax is not finite; sf = +-inf becomes FLT_MAX.

    With the built-in rules ("max" / "most_recent", no scaling_factor_compute_algo) this is one
    op, ``te_cpp.fp8_delayed_scaling_update`` (on the state's device, no host round trip); a
    callable rule runs as the tensor code below.
    """
    if not isinstance(state, DelayedScalingRecipeState):
        raise TypeError(f"update_delayed_scaling: expected a DelayedScalingRecipeState, got "
                        f"{type(state).__name__}")
    r = state.recipe
    h = state.amax_history
    if r.reduce_amax and dist.is_available() and dist.is_initialized() \
            and dist.get_world_size(state.amax_reduction_group) > 1:
        # the amaxes recorded since the last update, maximised over the ranks, so every rank
        # computes the same scales (TransformerEngine reduces over the autocast's group)
        dist.all_reduce(h[0], op=dist.ReduceOp.MAX, group=state.amax_reduction_group)
    fp8_max = get_fp8_max(r, state.mode == "forward")
    if not callable(r.amax_compute_algo) and r.scaling_factor_compute_algo is None:
        # the rule below, in one call (torch.ops.te_cpp.fp8_delayed_scaling_update)
        torch.ops.te_cpp.fp8_delayed_scaling_update(h, state.scale, fp8_max, r.margin,
                                                    r.amax_compute_algo)
        return
    if callable(r.amax_compute_algo):
        amax = r.amax_compute_algo(h)
    elif r.amax_compute_algo == "max":
        amax = torch.amax(h, dim=0)
    else:
        amax = h[0].clone()
    h.copy_(torch.roll(h, -1, 0))
    h[0].zero_()
    fp8_max = torch.tensor(fp8_max, dtype=torch.float32, device=amax.device)
    scale = state.scale
    if r.scaling_factor_compute_algo is not None:
        sf = r.scaling_factor_compute_algo(amax, scale, fp8_max, r)
    else:
        sf = (fp8_max / amax) / (2.0 ** r.margin)
        sf = torch.where(amax > 0.0, sf, scale)
        sf = torch.where(torch.isfinite(amax), sf, scale)
        sf = torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)
    scale.copy_(sf)
