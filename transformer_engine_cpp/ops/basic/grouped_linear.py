"""GroupedLinear: one linear transform per group of consecutive input rows (mixture of experts).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Callable, Optional

import torch

from .._common import (accumulate_main_grad, autocast_dtype, canonicalize_device,
                       canonicalize_dtype, check_numel, check_size, init_parameter,
                       materialize_device)
from ...quantization import FP8GlobalStateManager, QuantizerRole, RecipeState
from ...quantization.fp8_block import Float8BlockQuantizer
from ...quantization.nvfp4 import NVFP4Quantizer, check_nvfp4_shape
from ...quantization.quantizer import (Float8CurrentScalingQuantizer, Float8Quantizer,
                                       MXFP8Quantizer, check_mxfp8_shape)
from ...quantization.tensor import (Float8TensorStorage, MXFP8TensorStorage, QuantizedTensor,
                                    QuantizedTensorStorage, as_storage)
from ..op import BasicOperation, OperationContext
from .basic_linear import bind_quantized_weight, quantized_weight

_GROUPED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_ops = torch.ops.te_cpp


@dataclasses.dataclass
class GroupedLinearContext(OperationContext):
    """What GroupedLinear's backward reads besides its saved tensors."""

    #: the GEMMs' dtype (the autocast dtype, else the weights')
    dtype: Optional[torch.dtype] = None
    #: the input's dtype and shape (dx's)
    input_dtype: Optional[torch.dtype] = None
    input_shape: tuple = ()
    #: which gradients backward computes
    weight_requires_grad: bool = False
    bias_requires_grad: bool = False
    scales_requires_grad: bool = False
    #: the FP8 path ran: the input and weights are saved quantized (quantized_meta describes
    #: them) and backward quantizes dy per group with grad_output_quantizers
    with_quantized_compute: bool = False
    quantized_meta: Optional[tuple] = None
    grad_output_quantizers: Optional[list] = None
    #: the recipe's backward_override when the forward was quantized
    backward_override: Optional[str] = None


class _SplitQuantized:
    """A [T, K] operand quantized per group of rows (TransformerEngine's split-quantize), one
    custom op per copy over all groups, whose output shapes do not depend on the split values.
    ``kind`` and ``buffers``:

    * ``"fp8"``: per-tensor FP8, (data, scale_inv): one data buffer, a scale per group
      (``grouped_fp8_quantize``);
    * ``"mxfp8"``: an ``MXFP8TensorStorage``'s four buffers, blocks not straddling groups
      (``grouped_mxfp8_quantize``);
    * ``"block"``: Float8BlockScaling, (rowwise data, scale_inv, columnwise data, scale_inv),
      each group's blocks and tiles starting at its first row (``grouped_fp8_block_quantize``);
    * ``"nvfp4"``: (rowwise data, scales, amaxes, columnwise data, scales, amaxes), each group
      with its own amax and stochastic-rounding seed (``grouped_nvfp4_quantize``).

    Absent copies are None. ``fmt``: the FP8 dtype; for "block" also the block dim; for
    "nvfp4" whether the columnwise copy went through the random Hadamard transform. The GEMMs
    read the fp32 dequantization, the values a quantized GEMM multiplies."""

    def __init__(self, kind: str, buffers: tuple, fmt, nominal_dtype: torch.dtype,
                 shape) -> None:
        self.kind, self.buffers, self.fmt = kind, tuple(buffers), fmt
        self.nominal_dtype, self.shape = nominal_dtype, tuple(shape)

    @classmethod
    def quantize(cls, x: torch.Tensor, split_sizes: torch.Tensor, quantizers: list, *,
                 rowwise: bool, columnwise: bool) -> "_SplitQuantized":
        """Each group's rows with its quantizer (the groups' quantizers share one recipe's
        settings: the first one's are read, the per-group state of delayed scaling and the
        epsilons of current scaling are each group's)."""
        q = quantizers[0]
        if isinstance(q, MXFP8Quantizer):
            check_mxfp8_shape("GroupedLinear", x.shape, rowwise=rowwise, columnwise=columnwise)
            rd, rs, cd, cs = _ops.grouped_mxfp8_quantize.default(x, split_sizes, q.dtype,
                                                                 rowwise, columnwise)
            buffers = (rd, rs, None, None) if not columnwise else (
                (rd, rs, cd, cs) if rowwise else (None, None, cd, cs))
            return cls("mxfp8", buffers, q.dtype, x.dtype, x.shape)
        if isinstance(q, Float8BlockQuantizer):
            args = (x, split_sizes, q.dtype, q.block_scaling_dim, q.force_pow_2_scales,
                    q.amax_epsilon)
            rd = rs = cd = cs = None
            if rowwise:
                rd, rs = _ops.grouped_fp8_block_quantize.default(*args, False)
            if columnwise:
                cd, cs = _ops.grouped_fp8_block_quantize.default(*args, True)
            return cls("block", (rd, rs, cd, cs), (q.dtype, q.block_scaling_dim), x.dtype,
                       x.shape)
        if isinstance(q, NVFP4Quantizer):
            check_nvfp4_shape("GroupedLinear", x.shape, rowwise=rowwise, columnwise=columnwise)
            groups = len(quantizers)
            row = col = (None, None, None)
            seeds = q.seeds(x, groups * (int(rowwise) + int(columnwise)))  # per group and copy
            if rowwise:
                row = _ops.grouped_nvfp4_quantize.default(
                    x, split_sizes, False, False, q.with_2d_quantization,
                    None if seeds is None else seeds[:groups])
            if columnwise:
                col = _ops.grouped_nvfp4_quantize.default(
                    x, split_sizes, True, q.with_rht, q.with_2d_quantization,
                    None if seeds is None else seeds[-groups:])
            return cls("nvfp4", (*row, *col), q.with_rht, x.dtype, x.shape)
        if isinstance(q, Float8CurrentScalingQuantizer):  # the recipe's power-of-2 flag
            data, scale_inv, _ = _ops.grouped_fp8_quantize.default(
                x, split_sizes, None, q.dtype, q.force_pow_2_scales,
                [qg.amax_epsilon for qg in quantizers])
        elif isinstance(q, Float8Quantizer):  # delayed scaling: each group's scale and amax
            scales = torch.cat([qg.scale.reshape(1) for qg in quantizers])
            data, scale_inv, amax = _ops.grouped_fp8_quantize.default(
                x, split_sizes, scales, q.dtype, False, [0.0] * len(quantizers))
            with torch.no_grad():
                for g, qg in enumerate(quantizers):
                    qg.amax.copy_(torch.maximum(qg.amax, amax[g].reshape(qg.amax.shape)))
        else:
            raise NotImplementedError(f"GroupedLinear: quantization with {type(q).__name__} is "
                                      "not implemented")
        return cls("fp8", (data, scale_inv), q.dtype, x.dtype, x.shape)

    def rowwise(self, split_sizes: torch.Tensor) -> torch.Tensor:
        """The fp32 values of the copy blocked along the rows' features (the GEMMs that reduce
        over K)."""
        f32, kind = torch.float32, self.kind
        if kind == "fp8":
            data, scale_inv = self.buffers
            return _ops.grouped_fp8_dequantize.default(data, split_sizes, scale_inv, self.fmt,
                                                       f32)
        if kind == "mxfp8":
            return MXFP8TensorStorage(*self.buffers, self.fmt, self.nominal_dtype,
                                      self.shape).dequantize_rowwise(f32)
        if kind == "block":
            return _ops.grouped_fp8_block_dequantize.default(
                self.buffers[0], split_sizes, self.buffers[1], *self.fmt, False, f32)
        data, scales, amax = self.buffers[:3]
        return _ops.grouped_nvfp4_dequantize.default(data, split_sizes, scales, amax, False,
                                                     False, f32)

    def columnwise(self, split_sizes: torch.Tensor) -> torch.Tensor:
        """The fp32 values of the copy blocked down the columns within each group (the GEMM
        that reduces over the rows, wgrad), as [T, K]; per-tensor FP8 has one copy for
        both."""
        f32, kind = torch.float32, self.kind
        if kind == "fp8":
            return self.rowwise(split_sizes)
        if kind == "mxfp8":
            return MXFP8TensorStorage(*self.buffers, self.fmt, self.nominal_dtype,
                                      self.shape).dequantize_columnwise(f32)
        if kind == "block":
            return _ops.grouped_fp8_block_dequantize.default(
                self.buffers[2], split_sizes, self.buffers[3], *self.fmt, True, f32).t()
        data, scales, amax = self.buffers[3:]
        return _ops.grouped_nvfp4_dequantize.default(data, split_sizes, scales, amax, True,
                                                     self.fmt, f32).t()

    def metadata(self) -> tuple:
        """(buffer count, kind, format, nominal dtype, shape): constants for the backward."""
        return (len(self.buffers), self.kind, self.fmt, self.nominal_dtype, self.shape)

    @classmethod
    def from_buffers(cls, buffers, metadata) -> "_SplitQuantized":
        count, kind, fmt, nominal_dtype, shape = metadata
        return cls(kind, tuple(buffers)[:count], fmt, nominal_dtype, shape)


class WeightGradStore:
    """``delay_wgrad_compute``: the backward pass stores what the weight-gradient GEMMs need
    (TransformerEngine's store of the same name); :meth:`GroupedLinear.backward_dw` pops it and
    computes them."""

    def __init__(self, delay_wgrad_compute: bool) -> None:
        self._delay = bool(delay_wgrad_compute)
        self._queue: list = []

    def delay_wgrad_compute(self) -> bool:
        return self._delay

    def put(self, item) -> None:
        self._queue.append(item)

    def pop(self):
        return self._queue.pop(0)

    def empty(self) -> bool:
        return not self._queue


def _single_param_flags(single_grouped_weight: bool, single_grouped_bias: bool):
    """TransformerEngine gates the single grouped parameters behind an environment variable and
    turns them off with a warning when it is not set."""
    if not (single_grouped_weight or single_grouped_bias):
        return False, False
    if os.environ.get("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "0") in ("", "0"):
        warnings.warn("GroupedLinear: single_grouped_weight / single_grouped_bias need "
                      "NVTE_GROUPED_LINEAR_SINGLE_PARAM=1 (as in TransformerEngine); using one "
                      "parameter per group")
        return False, False
    raise NotImplementedError("GroupedLinear: single_grouped_weight / single_grouped_bias "
                              "(one GroupedTensor parameter) are not supported; use one "
                              "parameter per group (weight0, ..., bias0, ...)")


class GroupedLinear(BasicOperation):
    """``num_groups`` linear transforms over consecutive row blocks of the input: the input's
    rows (all dims but the last, flattened) are split along dim 0 by the split sizes, the extra
    input (an integer tensor of ``num_groups`` sizes summing to the rows); group i computes
    ``y_i = x_i W_i^T + b_i`` and the results are concatenated, as a ``torch.nn.Linear`` per
    split would. With ``scale_bias`` a second extra input, the per-row scales ``s`` (shape
    ``[rows]``, e.g. the router's probabilities), multiplies the bias: ``x_i W_i^T + s * b_i``,
    and gets its gradient.

    The forward, dgrad, wgrad and bias-gradient passes are one custom op call each for all
    groups (``te_cpp.grouped_linear_fwd`` / ``_dgrad`` / ``_wgrad``, ``grouped_bias_bwd``),
    whose output shapes do not depend on the split values, so torch.compile traces them with
    no data-dependent shape.

    Args:
        num_groups, in_features, out_features: the weights are ``weight0`` ...
            ``weight{num_groups-1}``, each ``(out_features, in_features)`` (Kaiming-uniform,
            as torch.nn.Linear), and the biases ``bias0`` ... (zeros): TransformerEngine's
            parameter names, so its checkpoints load.
        bias: whether there are biases.
        device, dtype: of the parameters (fp32, fp16, bf16 or fp64).
        rng_state_tracker_function: returns a context manager forking the RNG for the weight
            initialisation.
        accumulate_into_main_grad: add each dW into ``weight{i}.main_grad`` (eager only).
        single_grouped_weight, single_grouped_bias: as TransformerEngine, off (with a warning)
            unless ``NVTE_GROUPED_LINEAR_SINGLE_PARAM`` is set; not supported when it is.
        delay_wgrad_compute: backward skips the weight gradients and stores their inputs;
            :meth:`backward_dw` computes them later (eager only).
        scale_bias: the bias is scaled per row by the second extra input.
    """

    accepts_forward_kwargs = False
    context_type = GroupedLinearContext
    num_extra_inputs = 1

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        rng_state_tracker_function: Optional[Callable] = None,
        accumulate_into_main_grad: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        delay_wgrad_compute: bool = False,
        scale_bias: bool = False,
    ) -> None:
        name = "GroupedLinear"
        for arg, value in (("bias", bias), ("accumulate_into_main_grad",
                                            accumulate_into_main_grad),
                           ("delay_wgrad_compute", delay_wgrad_compute),
                           ("scale_bias", scale_bias)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}: {arg} must be a bool, got {value!r}")
        self._scale_bias = scale_bias and bias
        if self._scale_bias:  # before BasicOperation sizes the extra-input channels
            self.num_extra_inputs = 2
        super().__init__()
        self.num_groups = check_size(name, "num_groups", num_groups)
        self.in_features = check_size(name, "in_features", in_features)
        self.out_features = check_size(name, "out_features", out_features)
        self.single_grouped_weight, self.single_grouped_bias = _single_param_flags(
            single_grouped_weight, single_grouped_bias)
        self.use_bias = bias
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self.wgrad_store = WeightGradStore(delay_wgrad_compute)
        self._rng_state_tracker_function = rng_state_tracker_function
        # te.quantized_model_init: keep each weight quantized
        self._with_quantized_weight = FP8GlobalStateManager.with_fp8_parameters()
        self._init_recipe = FP8GlobalStateManager.get_fp8_model_init_recipe()
        self.device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype)
        if dtype not in _GROUPED_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {dtype} (expected float32, float16, "
                             "bfloat16 or float64)")
        check_numel(name, "weights", (self.num_groups, self.out_features, self.in_features),
                    dtype)
        for i in range(self.num_groups):
            self.register_parameter(f"weight{i}", torch.nn.Parameter(torch.empty(
                self.out_features, self.in_features, device="meta", dtype=dtype)))
        for i in range(self.num_groups):
            b = (torch.nn.Parameter(torch.empty(self.out_features, device="meta", dtype=dtype))
                 if bias else None)
            self.register_parameter(f"bias{i}", b)
        if delay_wgrad_compute:  # the weights' gradients come from backward_dw, not backward
            for w in self.weights():
                w.skip_backward_post_hook = True
        if self.device.type != "meta":
            self.reset_parameters()

    # ---- parameters ----------------------------------------------------------------------------

    def weights(self) -> list[torch.nn.Parameter]:
        return [self._parameters[f"weight{i}"] for i in range(self.num_groups)]

    def biases(self) -> list[torch.nn.Parameter]:
        return ([self._parameters[f"bias{i}"] for i in range(self.num_groups)]
                if self.use_bias else [])

    @property
    def has_bias(self) -> bool:
        return self.use_bias

    def reset_parameters(self) -> None:
        """Kaiming-uniform weights (each group's, as torch.nn.Linear) and zero biases;
        materialises meta parameters."""
        self.device = materialize_device(self.device)

        def fill(w):
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))

        for i, w in enumerate(self.weights()):  # quantized weights re-initialise unquantized
            if isinstance(w, QuantizedTensor):
                self.register_parameter(f"weight{i}", torch.nn.Parameter(
                    w.dequantize().detach(), requires_grad=w.requires_grad))
        for i in range(self.num_groups):
            if self._rng_state_tracker_function is not None:
                with self._rng_state_tracker_function().fork():
                    init_parameter(self, f"weight{i}", fill, self.device)
            else:
                init_parameter(self, f"weight{i}", fill, self.device)
            if self.use_bias:
                init_parameter(self, f"bias{i}", torch.nn.init.zeros_, self.device)
        if self._with_quantized_weight:
            self._quantize_weights()
        if self.wgrad_store.delay_wgrad_compute():
            for w in self.weights():
                w.skip_backward_post_hook = True

    def _quantize_weights(self) -> None:
        """te.quantized_model_init: each weight Parameter becomes a quantized tensor, quantized
        with its own weight quantizer of the init recipe (as BasicLinear's weight)."""
        recipe = FP8GlobalStateManager.get_fp8_model_init_recipe() or self._init_recipe
        self._init_recipe = recipe
        quantizers = RecipeState.create(recipe, mode="forward",
                                        num_quantizers=2 * self.num_groups,
                                        roles=self.get_quantizer_roles("forward")
                                        ).make_quantizers()
        for i, w in enumerate(self.weights()):
            self.register_parameter(f"weight{i}", quantized_weight(w, quantizers[2 * i + 1],
                                                                   "GroupedLinear"))

    def reset_recipe_state(self, *, recipe) -> None:
        """Quantized weights re-quantize their in-place updates with this op's weight
        quantizers (as BasicLinear's)."""
        super().reset_recipe_state(recipe=recipe)
        for w, q in zip(self.weights(), self._group_quantizers("forward", 1, 2)):
            bind_quantized_weight(w, q)

    def get_input_quantizer(self):
        """None: each group's rows are quantized with their own quantizer here, so the previous
        op hands its output over in high precision."""
        return None

    def get_grad_output_quantizer(self):
        """None: dy is quantized per group here (see get_input_quantizer)."""
        return None

    pre_fuser_forward = BasicOperation.materialize_meta_parameters

    def num_quantizers(self, mode: str) -> int:
        """TransformerEngine's: per group an input and a weight quantizer forward, a
        grad_output quantizer backward."""
        return 2 * self.num_groups if mode == "forward" else self.num_groups

    def get_quantizer_roles(self, mode: str) -> list:
        """Forward: group g's input (2g) and weight (2g + 1); backward: each group's
        grad_output (TransformerEngine's roles), so that every group's quantizers take their
        role's settings (weights: 128x128 tiles under Float8BlockScaling, 16x16 blocks under
        NVFP4)."""
        if mode == "forward":
            return [QuantizerRole(module_type="linear", tensor_type=t)
                    for _ in range(self.num_groups) for t in ("input", "weight")]
        return [QuantizerRole(module_type="linear", tensor_type="grad_output")
                for _ in range(self.num_groups)]

    def compile_unsupported_reason(self) -> Optional[str]:
        if self._accumulate_into_main_grad:
            return ("accumulate_into_main_grad adds into weight.main_grad in place, a mutation "
                    "of a tensor outside the compiled graph")
        if self.wgrad_store.delay_wgrad_compute():
            return ("delay_wgrad_compute keeps the weight-gradient inputs in the op's store, "
                    "outside the compiled graph")
        return super().compile_unsupported_reason()

    # ---- compute -------------------------------------------------------------------------------

    def op_forward(self, *args, **kwargs):
        raise RuntimeError("GroupedLinear runs through fuser_forward")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError("GroupedLinear runs through fuser_backward")

    def _split_sizes(self, split_sizes) -> torch.Tensor:
        if not isinstance(split_sizes, torch.Tensor):
            raise TypeError(f"GroupedLinear: the split sizes (extra input 0) must be a tensor, "
                            f"got {type(split_sizes).__name__}")
        if split_sizes.is_floating_point() or split_sizes.is_complex() \
                or split_sizes.dtype == torch.bool:
            raise TypeError(f"GroupedLinear: the split sizes must be an integer tensor, got "
                            f"{split_sizes.dtype}")
        groups = self.num_groups
        if torch.compiler.is_compiling():
            # the count may be data-dependent (torch.bincount's output length): asserted, not
            # branched on, so the trace goes on with a static [num_groups]
            torch._check(split_sizes.numel() == groups,
                         lambda: f"GroupedLinear: expected {groups} split sizes")
        elif split_sizes.numel() != groups:
            raise ValueError(f"GroupedLinear: expected {groups} split sizes, got shape "
                             f"{list(split_sizes.shape)}")
        return split_sizes.reshape(groups).to(torch.int64)

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        ctx = basic_op_ctxs[0]
        extra = basic_op_extra_inputs[0]
        split_sizes = self._split_sizes(extra[0])
        scales = extra[1] if self._scale_bias else None
        x = input_
        if not x.is_floating_point():
            raise TypeError(f"GroupedLinear: input must be floating point, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"GroupedLinear: input's last dimension (shape {list(x.shape)}) "
                             f"must equal in_features={self.in_features}")
        weights = self.weights()
        dtype = autocast_dtype(x, weights[0].dtype)
        ctx.dtype, ctx.input_dtype, ctx.input_shape = dtype, x.dtype, tuple(x.shape)
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != dtype:
            x2 = x2.to(dtype)
        bs = [b if b.dtype == dtype else b.to(dtype) for b in self.biases()]
        if scales is not None:
            if scales.shape != (x2.shape[0],):
                raise ValueError(f"GroupedLinear: the bias scales (extra input 1) must have "
                                 f"shape [{x2.shape[0]}] (one per input row), got "
                                 f"{list(scales.shape)}")
        if ctx.requires_grad:
            ctx.weight_requires_grad = any(w.requires_grad for w in weights)
            ctx.bias_requires_grad = self.use_bias and any(b.requires_grad
                                                           for b in self.biases())
            ctx.scales_requires_grad = bool(scales is not None and ctx.extra_inputs_requires_grad
                                            and ctx.extra_inputs_requires_grad[1])
        need_bias_pass = ctx.bias_requires_grad or ctx.scales_requires_grad
        saved_scales = scales if need_bias_pass else None
        saved_bs = bs if ctx.scales_requires_grad else []
        if self._quantizers is not None:
            y = self._quantized_forward(ctx, x2, split_sizes, bs, scales, saved_scales, saved_bs)
        else:
            ws = [self._weight_in(w, dtype) for w in weights]
            y = _ops.grouped_linear_fwd.default(x2, split_sizes, ws, bs, scales)
            if ctx.requires_grad:
                ctx.save_for_backward(
                    split_sizes, x2 if ctx.weight_requires_grad else None, saved_scales,
                    *(ws if ctx.input_requires_grad else [None] * self.num_groups), *saved_bs)
        return y.reshape(*x.shape[:-1], self.out_features), [()]

    @staticmethod
    def _weight_in(w, dtype: torch.dtype) -> torch.Tensor:
        """A weight for the high-precision GEMMs (a quantized weight dequantized)."""
        if isinstance(w, QuantizedTensor):
            return w.dequantize(dtype=dtype)
        return w if w.dtype == dtype else w.to(dtype)

    def _group_quantizers(self, mode: str, index: int, stride: int) -> list:
        return [self.get_quantizer(mode, stride * g + index) for g in range(self.num_groups)]

    def _quantized_forward(self, ctx: GroupedLinearContext, x2, split_sizes, bs, scales,
                           saved_scales, saved_bs) -> torch.Tensor:
        """The FP8 forward, emulated exactly as BasicLinear's: x quantized per group with the
        group's input quantizer (TransformerEngine's quantizers 2g), each weight with its own
        (2g + 1); the GEMMs multiply the fp32 dequantizations with fp32 accumulation, the bias
        (scaled) added in fp32 and the result rounded once to the compute dtype. The saved
        tensors are the quantized buffers."""
        ctx.with_quantized_compute = True
        ctx.grad_output_quantizers = self._group_quantizers("backward", 0, 1)
        override = ctx.backward_override = self.backward_override()
        need_dgrad = ctx.requires_grad and ctx.input_requires_grad
        # the columnwise copies feed the quantized backward GEMMs only
        xq = _SplitQuantized.quantize(x2, split_sizes, self._group_quantizers("forward", 0, 2),
                                      rowwise=True,
                                      columnwise=ctx.weight_requires_grad and override is None)
        wqs = []
        for w, q in zip(self.weights(), self._group_quantizers("forward", 1, 2)):
            if isinstance(w, QuantizedTensor):  # te.quantized_model_init: its own buffers
                wqs.append(as_storage(w))
            else:
                wq_in = w if w.dtype == ctx.dtype else w.to(ctx.dtype)
                wqs.append(q.quantize_storage(wq_in, rowwise=True,
                                              columnwise=need_dgrad and override is None,
                                              op="GroupedLinear"))
        f32 = torch.float32
        if (xq.kind == "fp8" and all(isinstance(wq, Float8TensorStorage) for wq in wqs)
                and len({wq._fp8_dtype for wq in wqs}) == 1):
            # per-tensor FP8: one op on the quantized buffers
            y = _ops.grouped_fp8_linear_fwd.default(
                *xq.buffers, xq.fmt, split_sizes, [wq._data for wq in wqs],
                [wq._scale_inv for wq in wqs], wqs[0]._fp8_dtype, bs, scales, ctx.dtype)
        else:
            y = _ops.grouped_linear_fwd.default(
                xq.rowwise(split_sizes), split_sizes,
                [wq.dequantize_rowwise(f32) for wq in wqs], [b.to(f32) for b in bs],
                None if scales is None else scales.to(f32))
        if ctx.requires_grad and override == "high_precision":  # the unquantized backward
            ctx.with_quantized_compute = False
            ws = [self._weight_in(w, ctx.dtype) for w in self.weights()]
            ctx.save_for_backward(
                split_sizes, x2 if ctx.weight_requires_grad else None, saved_scales,
                *(ws if need_dgrad else [None] * self.num_groups), *saved_bs)
        elif ctx.requires_grad:
            x_bufs = xq.buffers if ctx.weight_requires_grad else ()
            w_bufs = [t for wq in wqs for t in wq.buffers()] if need_dgrad else []
            ctx.save_for_backward(split_sizes, None, saved_scales, *saved_bs, *x_bufs, *w_bufs)
            # each weight's (buffer count, storage metadata): storages have 4 buffers (FP8,
            # MXFP8, Float8BlockScaling) or 6 (NVFP4)
            ctx.quantized_meta = (len(saved_bs), xq.metadata() if x_bufs else None,
                                  [(len(wq.buffers()), wq.metadata()) for wq in wqs]
                                  if w_bufs else None)
        return y if y.dtype == ctx.dtype else y.to(ctx.dtype)

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        g = self.num_groups
        saved = ctx.saved_tensors
        split_sizes, x2, scales = saved[:3]
        dy = grad_output.reshape(-1, self.out_features)
        if dy.dtype != ctx.dtype:
            dy = dy.to(ctx.dtype)
        if ctx.with_quantized_compute:
            bs, (dy_dgrad, ws), (dy_wgrad, x2) = self._quantized_operands(ctx, saved, dy)
        else:
            ws, bs = list(saved[3:3 + g]), list(saved[3 + g:])
            dy_dgrad = dy_wgrad = dy
        dx = None
        if ctx.input_requires_grad:
            dx = _ops.grouped_linear_dgrad.default(dy_dgrad, split_sizes, ws)
            dx = dx.reshape(ctx.input_shape)
            if dx.dtype != ctx.input_dtype:
                dx = dx.to(ctx.input_dtype)
        dws = [None] * g
        if ctx.weight_requires_grad:
            if self.wgrad_store.delay_wgrad_compute():
                self.wgrad_store.put((dy_wgrad, x2, split_sizes))
            else:
                dws = self._finish_wgrads(_ops.grouped_linear_wgrad.default(dy_wgrad, x2,
                                                                            split_sizes))
        dbs, dscales = [None] * g if self.use_bias else [], None
        if ctx.bias_requires_grad or ctx.scales_requires_grad:
            bias_dtype = self._parameters["bias0"].dtype
            db_list, ds = _ops.grouped_bias_bwd.default(dy, split_sizes, bs, scales, bias_dtype)
            if ctx.bias_requires_grad:
                dbs = [db if b.requires_grad else None for b, db in zip(self.biases(), db_list)]
            if ctx.scales_requires_grad:
                dscales = ds
        param_grads = [*dws, *dbs]
        extra_grads = (None, dscales) if self._scale_bias else (None,)
        return dx, [param_grads], [extra_grads]

    def _quantized_operands(self, ctx: GroupedLinearContext, saved: tuple, dy: torch.Tensor):
        """The FP8 backward's operands, fp32 dequantizations as the forward's: dy quantized per
        group with the grad_output quantizers (the rowwise copy for dgrad, the columnwise one
        for wgrad), the weights' columnwise copies and the input's columnwise copy. Returns
        (biases, (dy, weights) for dgrad, (dy, x) for wgrad); dbias and dscales take the
        high-precision dy, as in TransformerEngine. With backward_override="dequantized" the
        GEMMs are unquantized: dy as it is, the saved rowwise copies dequantized to the compute
        dtype."""
        n_bs, x_meta, w_meta = ctx.quantized_meta
        split_sizes = saved[0]
        bs = list(saved[3:3 + n_bs])
        rest = saved[3 + n_bs:]
        dgrad = wgrad = (None, None)
        if not (x_meta is not None or w_meta is not None):
            return bs, dgrad, wgrad  # bias-only training: dy is not quantized
        if ctx.backward_override == "dequantized":  # unquantized GEMMs on the saved values
            if x_meta is not None:
                count = x_meta[0]
                xq = _SplitQuantized.from_buffers(rest[:count], x_meta)
                rest = rest[count:]
                wgrad = (dy, xq.rowwise(split_sizes).to(ctx.dtype))
            if w_meta is not None:
                dgrad = (dy, [wq.dequantize_rowwise(ctx.dtype)
                              for wq in self._saved_weights(rest, w_meta)])
            return bs, dgrad, wgrad
        dyq = _SplitQuantized.quantize(dy, split_sizes, ctx.grad_output_quantizers,
                                       rowwise=w_meta is not None, columnwise=x_meta is not None)
        if x_meta is not None:
            count = x_meta[0]
            xq = _SplitQuantized.from_buffers(rest[:count], x_meta)
            rest = rest[count:]
            wgrad = (dyq.columnwise(split_sizes), xq.columnwise(split_sizes))
        if w_meta is not None:
            ws = [wq.dequantize_columnwise(torch.float32)
                  for wq in self._saved_weights(rest, w_meta)]
            dgrad = (dyq.rowwise(split_sizes), ws)
        return bs, dgrad, wgrad

    @staticmethod
    def _saved_weights(buffers, w_meta) -> list:
        """The weights' quantized storages from their saved buffers, one after the other."""
        out, start = [], 0
        for count, meta in w_meta:
            out.append(QuantizedTensorStorage.from_buffers(buffers[start:start + count], meta))
            start += count
        return out

    def _finish_wgrads(self, dws) -> list:
        """Each dW as its weight's gradient: added into ``weight{i}.main_grad`` with
        accumulate_into_main_grad, else in the weight's dtype."""
        out = []
        for i, (w, dw) in enumerate(zip(self.weights(), dws)):
            if not w.requires_grad:
                out.append(None)
            elif self._accumulate_into_main_grad:
                out.append(accumulate_main_grad(w, dw, "GroupedLinear", f"weight{i}"))
            else:
                out.append(dw if dw.dtype == w.dtype else dw.to(w.dtype))
        return out

    def need_backward_dw(self) -> bool:
        """Whether :meth:`backward_dw` must run to finish the weight gradients."""
        return self.wgrad_store.delay_wgrad_compute()

    def backward_dw(self) -> None:
        """``delay_wgrad_compute``: the weight gradients of the oldest stored backward pass,
        written to ``weight{i}.grad`` (or added into ``main_grad``)."""
        if not self.need_backward_dw() or self.wgrad_store.empty():
            return
        dy, x2, split_sizes = self.wgrad_store.pop()
        dws = self._finish_wgrads(_ops.grouped_linear_wgrad.default(dy, x2, split_sizes))
        for w, dw in zip(self.weights(), dws):
            if dw is not None and not self._accumulate_into_main_grad:
                w.grad = dw

    def extra_repr(self) -> str:
        text = (f"num_groups={self.num_groups}, in_features={self.in_features}, "
                f"out_features={self.out_features}, bias={self.use_bias}")
        if self._scale_bias:
            text += ", scale_bias=True"
        return text

