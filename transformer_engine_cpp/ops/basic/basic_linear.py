"""BasicLinear: y = x W^T, with W of shape (out_features, in_features)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import torch

from .._common import (accumulate_main_grad, autocast_dtype, canonicalize_device,
                       canonicalize_dtype, check_numel, check_size, compute_dtype, init_parameter,
                       materialize_device)
from ... import _comm
from ...quantization import FP8GlobalStateManager, RecipeState
from ...quantization.fp8_block import Float8BlockQuantizer, Float8BlockwiseQTensor
from ...quantization.nvfp4 import NVFP4Quantizer, NVFP4Tensor, check_nvfp4_shape
from ...quantization.quantizer import (Float8CurrentScalingQuantizer, MXFP8Quantizer,
                                       _PerTensorQuantizer, check_mxfp8_shape)
from ...quantization.tensor import (Float8Tensor, Float8TensorStorage, MXFP8Tensor,
                                    MXFP8TensorStorage, QuantizedTensor, QuantizedTensorStorage,
                                    as_storage, bind_quantizer)
from .. import _quantized
from ..op import BasicOperation, OperationContext

_LINEAR_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# the custom ops' OpOverloads (host cost: docs/architecture.md)
_linear_fwd = torch.ops.te_cpp.linear_fwd.default
_transpose_2d = torch.ops.te_cpp.transpose_2d.default
_linear_fwd_add = torch.ops.te_cpp.linear_fwd_add.default
_linear_dgrad = torch.ops.te_cpp.linear_dgrad.default
_linear_dgrad_add = torch.ops.te_cpp.linear_dgrad_add.default
_linear_wgrad = torch.ops.te_cpp.linear_wgrad.default
_linear_bwd = torch.ops.te_cpp.linear_bwd.default
_bias_bwd = torch.ops.te_cpp.bias_bwd.default
_fp8_gemm = torch.ops.te_cpp.fp8_gemm.default
_mxfp8_gemm = torch.ops.te_cpp.mxfp8_gemm.default
_FP8_GEMM_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fp8_gemm_fits(xq, wq, dtype: torch.dtype) -> bool:
    """Whether the forward GEMM of two quantized operands runs as te_cpp.fp8_gemm: per-tensor
    FP8 (Float8TensorStorage) on both sides, within fp8_gemm's limits (``_fp8_gemm_takes``)."""
    if not (isinstance(xq, Float8TensorStorage) and isinstance(wq, Float8TensorStorage)):
        return False
    n, k = wq._data.shape
    return _fp8_gemm_takes(xq._data, xq._fp8_dtype, wq._fp8_dtype, n, k, dtype)


def _fp8_gemm_takes(a_data: torch.Tensor, a_fp8: torch.dtype, b_fp8: torch.dtype, n: int, k: int,
                    dtype: torch.dtype) -> bool:
    """Whether te_cpp.fp8_gemm takes a GEMM with b of shape [n, k] (the reduction dim k last) and
    output dtype ``dtype``. On CPU the op is the exact emulation, always; on CUDA it is
    cuBLASLt's FP8 GEMM, which needs k and n multiples of 16, a float32 / bfloat16 / float16
    output and not both operands E5M2 (otherwise BasicLinear runs the emulation there too). The
    operands it is given are either the quantizer's fresh buffers or transposes made contiguous
    here, so they are 16-byte aligned."""
    if not a_data.is_cuda:
        return True
    return (k % 16 == 0 and n % 16 == 0 and dtype != torch.float64
            and not (a_fp8 == torch.float8_e5m2 and b_fp8 == torch.float8_e5m2))


def _mx_rows(q) -> Optional[tuple]:
    """An MXFP8 storage's rowwise copy as an mxfp8_gemm operand (data, scale, fp8 dtype), or
    None for another storage or a missing copy."""
    if isinstance(q, MXFP8TensorStorage) and q._rowwise_data is not None:
        return q._rowwise_data, q._rowwise_scale_inv, q._fp8_dtype
    return None


def _mx_cols(q) -> Optional[tuple]:
    """An MXFP8 storage's columnwise copy (the 2-D transpose, blocked along its last dim) as an
    mxfp8_gemm operand, or None."""
    if isinstance(q, MXFP8TensorStorage) and q._columnwise_data is not None:
        return q._columnwise_data, q._columnwise_scale_inv, q._fp8_dtype
    return None


def _columnwise(q: Float8TensorStorage) -> torch.Tensor:
    """The column-wise copy of per-tensor FP8 data (TransformerEngine's on Hopper): the 2-D
    transpose [last dim, rows] of the uint8 buffer, made contiguous (te_cpp.transpose_2d). The
    scale-inverse is the row-wise copy's (one per-tensor scale serves both)."""
    data = q._data
    if data.dim() != 2:
        data = data.reshape(-1, data.shape[-1])
    return _transpose_2d(data)


def quantized_weight(w: torch.nn.Parameter, quantizer, who: str) -> torch.nn.Parameter:
    """te.quantized_model_init: ``w`` as a quantized Parameter (a Float8Tensor for the
    per-tensor recipes, an MXFP8Tensor with both copies for MXFP8BlockScaling, a
    Float8BlockwiseQTensor for Float8BlockScaling, an NVFP4Tensor for NVFP4BlockScaling, both
    copies each); NotImplementedError naming the op for any other quantizer."""
    if not isinstance(quantizer, (_PerTensorQuantizer, MXFP8Quantizer, Float8BlockQuantizer,
                                  NVFP4Quantizer)):
        raise NotImplementedError(f"{who}: quantized weights (te.quantized_model_init) are not "
                                  f"implemented for {type(quantizer).__name__}")
    if isinstance(quantizer, MXFP8Quantizer):
        check_mxfp8_shape(who, w.shape, rowwise=True, columnwise=True)
    if isinstance(quantizer, NVFP4Quantizer):
        check_nvfp4_shape(who, w.shape, rowwise=True, columnwise=True)
    return torch.nn.Parameter(quantizer.quantize(w.detach()), requires_grad=w.requires_grad)


def bind_quantized_weight(w, quantizer) -> None:
    """A quantized weight re-quantizes its in-place updates with the op's weight quantizer of
    the active recipe (as TransformerEngine points a quantized weight's quantizer at the op's),
    when that quantizer makes the same kind of tensor with the same layout: the same FP8 format;
    for Float8BlockScaling the same blocks (1x128 or 128x128 scales), for NVFP4 the same
    column-wise Hadamard transform. Otherwise the weight keeps the quantizer it was made with."""
    if ((isinstance(w, Float8Tensor) and isinstance(quantizer, _PerTensorQuantizer))
            or (isinstance(w, MXFP8Tensor) and isinstance(quantizer, MXFP8Quantizer)
                and quantizer.dtype == w._fp8_dtype)
            or (isinstance(w, Float8BlockwiseQTensor)
                and isinstance(quantizer, Float8BlockQuantizer)
                and quantizer.dtype == w._fp8_dtype
                and quantizer.block_scaling_dim == (2 if w._is_2D_scaled else 1))
            or (isinstance(w, NVFP4Tensor) and isinstance(quantizer, NVFP4Quantizer)
                and quantizer.with_rht == w._columnwise_rht)):
        bind_quantizer(w, quantizer)


@dataclasses.dataclass
class LinearContext(OperationContext):
    """What BasicLinear's backward reads besides its saved tensors (TransformerEngine's context
    fields for BasicLinear, plus the dtypes)."""

    #: the GEMMs' dtype (the autocast dtype, else the weight's)
    dtype: Optional[torch.dtype] = None
    #: the input's dtype, dx's dtype
    input_dtype: Optional[torch.dtype] = None
    #: whether dW is computed (the op is reached and the weight is trained)
    weight_requires_grad: bool = False
    #: the FP8 path ran: the saved tensors are quantized buffers described by quantized_meta
    with_quantized_compute: bool = False
    input_quantizer: Any = None
    weight_quantizer: Any = None
    grad_output_quantizer: Any = None
    grad_input_quantizer: Any = None
    #: (input meta, weight meta) of the saved FP8 buffers
    quantized_meta: Optional[tuple] = None
    #: the previous op handed the input over already quantized (the neighbour protocol)
    input_was_quantized: bool = False
    #: the next op handed dy over already quantized (set in backward)
    grad_output_was_quantized: bool = False
    #: column-parallel sequence parallelism: the saved FP8 input is the gathered one (else the
    #: local chunk, gathered again for wgrad)
    saved_input_gathered: bool = False


class BasicLinear(BasicOperation):
    """Linear transform without bias: ``y = x W^T``.

    The forward GEMM and the backward dgrad / wgrad GEMMs are ATen's (MKL or oneDNN on CPU),
    called from ``torch.ops.te_cpp.linear_fwd`` / ``linear_dgrad`` / ``linear_wgrad``; dgrad is
    skipped when the input needs no gradient and wgrad when the weight needs none.

    Args:
        in_features, out_features: the weight is ``(out_features, in_features)``.
        device, dtype: of the weight (defaults: torch's default device and dtype); fp32, fp16,
            bf16 or fp64.
        tensor_parallel_mode: None, ``"column"`` (the weight's rows, i.e. the output
            features, split over the ranks: this rank holds ``[out_features / size,
            in_features]``) or ``"row"`` (the input features split: ``[out_features,
            in_features / size]``). Column: the input is replicated, the output is this rank's
            feature slice, and dx is all-reduced. Row: the input is this rank's feature slice
            and the output is all-reduced. A group of one rank turns it off.
        tensor_parallel_group: the process group (the default group when None).
        sequence_parallel: with tensor parallelism, the replicated side is split along dim 0
            (the sequence or batch dim) instead: column mode all-gathers the input before the
            GEMM (and again for wgrad) and reduce-scatters dx; row mode reduce-scatters the
            output and all-gathers dy. docs/parallelism.md has the shapes per rank.
        userbuffers_options: TransformerEngine's experimental Userbuffers overlap (GPU); not
            supported (an error if given).
        rng_state_tracker_function: returns a context manager forking the RNG for the weight
            initialisation, as in TransformerEngine.
        accumulate_into_main_grad: add dW into ``weight.main_grad`` (which the caller creates)
            instead of returning it as ``weight.grad``. Eager mode only.
    """

    accepts_forward_kwargs = False
    accepts_quantized_input = True  # the GEMM operand (prepare)
    accepts_quantized_grad_output = True
    context_type = LinearContext

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel_mode: Optional[str] = None,
        tensor_parallel_group=None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Optional[Callable] = None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options: Optional[dict] = None,
    ) -> None:
        super().__init__()
        name = self.__class__.__name__
        self.in_features = check_size(name, "in_features", in_features)
        self.out_features = check_size(name, "out_features", out_features)
        if userbuffers_options:
            raise NotImplementedError(f"{name}: userbuffers_options (TransformerEngine's "
                                      "Userbuffers communication overlap) is not supported")
        (self.tensor_parallel_mode, self.tensor_parallel_group, self.tensor_parallel_size,
         self.sequence_parallel, self.local_in_features,
         self.local_out_features) = _comm.tensor_parallel_config(
             name, tensor_parallel_mode, tensor_parallel_group, sequence_parallel,
             self.in_features, self.out_features)
        tp = self.tensor_parallel_mode
        # the collectives this op runs (each is its own dual's in backward)
        self._gathers_input = tp == "column" and self.sequence_parallel
        self._gathers_grad_output = tp == "row" and self.sequence_parallel
        if not isinstance(accumulate_into_main_grad, bool):
            raise TypeError(f"{name}: accumulate_into_main_grad must be a bool")
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self._rng_state_tracker_function = rng_state_tracker_function
        # te.quantized_model_init: keep the weight quantized
        self._with_quantized_weight = FP8GlobalStateManager.with_fp8_parameters()
        self._init_recipe = FP8GlobalStateManager.get_fp8_model_init_recipe()
        self.device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype)
        if dtype not in _LINEAR_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {dtype} (expected float32, float16, "
                             "bfloat16 or float64)")
        shape = (self.local_out_features, self.local_in_features)
        check_numel(name, "weight", shape, dtype)
        self.weight = torch.nn.Parameter(torch.empty(shape, device="meta", dtype=dtype))
        if self.device.type != "meta":
            self.reset_parameters()

    # ---- parameters ----------------------------------------------------------------------------

    def reset_parameters(self) -> None:
        """Kaiming-uniform weight (as torch.nn.Linear); materialises a meta weight."""
        self.device = materialize_device(self.device)

        def fill(w):
            torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))

        if isinstance(self.weight, QuantizedTensor):  # re-initialise in high precision
            self.weight = torch.nn.Parameter(self.weight.dequantize().detach(),
                                             requires_grad=self.weight.requires_grad)
        if self._rng_state_tracker_function is not None:
            with self._rng_state_tracker_function().fork():
                init_parameter(self, "weight", fill, self.device)
        else:
            init_parameter(self, "weight", fill, self.device)
        if self._with_quantized_weight:
            self._quantize_weight()

    def _quantize_weight(self) -> None:
        """te.quantized_model_init: the weight Parameter becomes a Float8Tensor (per-tensor
        recipes) or an MXFP8Tensor, quantized with the init recipe's weight quantizer.
        Optimizer updates re-quantize it in place (the quantized tensors handle in-place ops),
        and the FP8 GEMMs use its buffers directly."""
        recipe = FP8GlobalStateManager.get_fp8_model_init_recipe() or self._init_recipe
        self._init_recipe = recipe
        quantizer = RecipeState.create(recipe, mode="forward", num_quantizers=2).make_quantizers()[1]
        self.weight = quantized_weight(self.weight, quantizer, type(self).__name__)

    # deferred initialisation: parameters built on the meta device materialise on first use
    pre_fuser_forward = BasicOperation.materialize_meta_parameters

    @property
    def weight_dtype(self) -> torch.dtype:
        """The weight's dtype (a quantized weight's nominal one): the GEMMs' dtype outside
        torch autocast (for the fusion functions' plan-time checks)."""
        return self._parameters["weight"].dtype

    def autocast_enabled(self) -> bool:
        """Whether torch autocast is on for the weight's device type (the GEMMs then compute
        in the autocast dtype; for the fusion functions' plan-time checks)."""
        return compute_dtype(self._parameters["weight"].device.type, None) is not None

    def num_quantizers(self, mode: str) -> int:
        """Forward: input (0) and weight (1); backward: grad_output (0)."""
        return 2 if mode == "forward" else 1

    def reset_recipe_state(self, *, recipe) -> None:
        """A quantized weight re-quantizes its in-place updates with this op's weight
        quantizer (as TransformerEngine's pre_forward), so under delayed scaling the weight's
        amax goes into this op's history and the updated scale applies to the next update."""
        super().reset_recipe_state(recipe=recipe)
        self._configure_amax_reduction()
        bind_quantized_weight(self._parameters.get("weight"), self.get_quantizer("forward", 1))

    def compile_unsupported_reason(self) -> Optional[str]:
        if self._accumulate_into_main_grad:
            return ("accumulate_into_main_grad adds into weight.main_grad in place, a mutation "
                    "of a tensor outside the compiled graph")
        return super().compile_unsupported_reason()

    # ---- compute (shared with the fused linear ops) --------------------------------------------

    def prepare(self, ctx: LinearContext, input_: torch.Tensor):
        """Input and weight in the compute dtype (the autocast dtype when autocast is on, else
        the weight's), recording the dtypes on ctx. An input the previous op already quantized
        (the neighbour protocol) is returned as it is."""
        if _quantized.is_storage(input_):
            weight = self._parameters["weight"]
            dtype = autocast_dtype(weight, weight.dtype)
            ctx.dtype = dtype
            ctx.input_dtype = input_.nominal_dtype
            return input_, self._weight_in(dtype)
        if not input_.is_floating_point():
            raise TypeError(f"{self.__class__.__name__}: input must be floating point, "
                            f"got {input_.dtype}")
        dtype = autocast_dtype(input_, self._parameters["weight"].dtype)
        ctx.dtype = dtype
        ctx.input_dtype = input_.dtype
        x = input_ if input_.dtype == dtype else input_.to(dtype)
        return x, self._weight_in(dtype)

    def _weight_in(self, dtype: torch.dtype):
        """The weight for this call's GEMMs: a quantized weight stays quantized for the FP8
        path (its buffers are the GEMM operand) and is dequantized for the high-precision one."""
        w = self._parameters["weight"]
        if isinstance(w, QuantizedTensor):
            return w if self._quantizers is not None else w.dequantize(dtype=dtype)
        return w if w.dtype == dtype else w.to(dtype)

    def save_ctx(self, ctx: LinearContext, x: torch.Tensor, w: torch.Tensor) -> None:
        """What the unquantized backward needs (the quantization fields keep their defaults:
        no quantized compute, no quantizers)."""
        ctx.weight_requires_grad = ctx.requires_grad and self._parameters["weight"].requires_grad
        if ctx.requires_grad:
            ctx.save_for_backward(x if ctx.weight_requires_grad else None,
                                  w if ctx.input_requires_grad else None)

    def op_forward(self, ctx: LinearContext, input_: torch.Tensor, *,
                   prev_op_grad_output_quantizer=None, next_op_input_quantizer=None, **kwargs):
        x, w = self.prepare(ctx, input_)
        if self._quantizers is not None:
            return self._quantized_forward(ctx, x, w)
        x = _quantized.as_high_precision(x)
        y = _linear_fwd(self.gather_input(x) if self._gathers_input else x, w)
        self.save_ctx(ctx, x, w)
        return self.reduce_output(y) if self.tensor_parallel_mode == "row" else y

    # ---- tensor parallelism --------------------------------------------------------------------

    def gather_input(self, x: torch.Tensor) -> torch.Tensor:
        """The forward GEMM's input: with column-parallel sequence parallelism every rank's
        dim-0 chunk, all-gathered; otherwise ``x``. (The fused forwards call it too.)"""
        if not self._gathers_input:
            return x
        return _comm.wait(self._start_gather(x, "input"))

    def reduce_output(self, y: torch.Tensor) -> torch.Tensor:
        """Row parallelism: the partial products summed over the ranks (all-reduce), or with
        sequence parallelism this rank's dim-0 chunk of the sum (reduce-scatter)."""
        if self.tensor_parallel_mode != "row":
            return y
        return _comm.wait(self._start_reduction(y, "output"))

    def _start_grad_input_reduction(self, dx: torch.Tensor):
        """Column parallelism: dx summed over the ranks as ``reduce_output`` sums y;
        asynchronous, so the wgrad GEMM overlaps it. The caller waits (``_comm.wait``)."""
        if self.tensor_parallel_mode != "column":
            return dx
        return self._start_reduction(dx, "input gradient")

    def _start_reduction(self, t: torch.Tensor, what: str):
        """An asynchronous sum of ``t`` over the tensor-parallel group: this rank's dim-0 chunk
        of it with sequence parallelism (reduce-scatter), else all of it (all-reduce)."""
        group = self.tensor_parallel_group
        if self.sequence_parallel:
            return _comm.reduce_scatter(t, group, self.tensor_parallel_size,
                                        who=type(self).__name__, what=what)
        return _comm.all_reduce(t, group)

    def _start_gather(self, t: torch.Tensor, what: str):
        """An asynchronous all-gather of ``t`` over the tensor-parallel group."""
        return _comm.all_gather(t, self.tensor_parallel_group, who=type(self).__name__,
                                what=what)

    def _gather_quantized(self, x, quantizer, what: str, *, rowwise: bool, columnwise: bool):
        """The all-gathered operand of a sequence-parallel GEMM, quantized, and the local
        quantized chunk it was gathered from (None if there is none). Per-tensor FP8 by this
        op's quantizer travels as FP8: the scale is the same on every rank (current scaling
        reduces the amax over the group first, delayed scaling's scale comes from the amaxes
        reduced over the group), so the gathered bytes with that scale are exactly the
        quantization of the gathered tensor. Anything else (MXFP8, whose blocks follow the
        gathered layout, or an input another quantizer made) is gathered in high precision and
        quantized whole."""
        per_tensor = isinstance(quantizer, _PerTensorQuantizer)
        local = None
        if _quantized.is_storage(x):
            if per_tensor and isinstance(x, Float8TensorStorage) and x._quantizer is quantizer:
                local = x
            else:
                x = x.dequantize()
        elif per_tensor:
            local = quantizer.quantize_storage(x, op=type(self).__name__)
        if local is None:
            full = _comm.wait(self._start_gather(x, what))
            return quantizer.quantize_storage(full, rowwise=rowwise, columnwise=columnwise,
                                              op=type(self).__name__), None
        return self._gather_fp8(local, what), local

    def _gather_fp8(self, q: Float8TensorStorage, what: str) -> Float8TensorStorage:
        """Per-tensor FP8 gathered as its bytes, with the (group-wide) scale."""
        data = _comm.wait(self._start_gather(q._data, what))
        return Float8TensorStorage(data, q._scale_inv, q._fp8_dtype, q._nominal_dtype,
                                   q._quantizer)

    def _configure_amax_reduction(self) -> None:
        """Current scaling of an operand that is all-gathered before its GEMM reduces the amax
        over the tensor-parallel group (TransformerEngine's ``with_amax_reduction``), so every
        rank quantizes its chunk with the scale a single process computes for the whole:
        column-parallel sequence parallelism's input, row-parallel sequence parallelism's
        grad_output. The neighbour that emits the operand quantized uses the same quantizer."""
        for mode, gathers in (("forward", self._gathers_input),
                              ("backward", self._gathers_grad_output)):
            q = self.get_quantizer(mode, 0)
            if gathers and isinstance(q, Float8CurrentScalingQuantizer):
                q.amax_reduction_group = self.tensor_parallel_group

    def get_input_quantizer(self):
        return self._neighbour_quantizer(super().get_input_quantizer(), self._gathers_input)

    def get_grad_output_quantizer(self):
        return self._neighbour_quantizer(super().get_grad_output_quantizer(),
                                         self._gathers_grad_output)

    def _neighbour_quantizer(self, q, gathered: bool):
        """The quantizer a neighbour may emit with: none for an operand that is gathered in
        high precision (not per-tensor FP8, see _gather_quantized). The columnwise copies of
        the input and of dy feed the wgrad alone, so for a frozen weight the neighbour gets the
        row-wise-only variant of the quantizer (TransformerEngine's usages: rowwise always,
        columnwise where the weight is trained; the pipeline asks for that variant itself
        where the backward does not reach the op, e.g. under no_grad)."""
        if q is None or (gathered and not isinstance(q, _PerTensorQuantizer)):
            return None
        if self._parameters["weight"].requires_grad:
            return q
        return q.usage_variant(rowwise=True, columnwise=False)

    # ---- FP8 -----------------------------------------------------------------------------------

    def _quantized_forward(self, ctx: LinearContext, x: torch.Tensor, w: torch.Tensor, *,
                           bias: Optional[torch.Tensor] = None,
                           extra: Optional[torch.Tensor] = None, alpha: float = 1.0):
        """FP8 GEMM, emulated exactly: the quantized operands' dequantization multiplied with
        fp32 accumulation. The saved tensors are the quantized buffers (for dgrad the weight's
        columnwise copy, for wgrad the input's: with column-parallel sequence parallelism the
        local chunk, gathered again in backward, unless it was gathered in high precision).

        The forward fusions pass the GEMM's epilogue: ``bias`` (added in fp32 before the one
        rounding to the compute dtype, as an FP8 GEMM's bias epilogue), and ``extra`` and
        ``alpha`` (``extra + alpha * x W^T + bias`` accumulated in fp32, returned in fp32 for
        the caller to round into the residual's dtype or buffer)."""
        ctx.with_quantized_compute = True
        ctx.input_quantizer = self.get_quantizer("forward", 0)
        ctx.weight_quantizer = self.get_quantizer("forward", 1)
        ctx.grad_output_quantizer = self.get_quantizer("backward", 0)
        ctx.grad_input_quantizer = None
        ctx.weight_requires_grad = ctx.requires_grad and self.weight.requires_grad
        need_dgrad = ctx.requires_grad and ctx.input_requires_grad
        ctx.input_was_quantized = _quantized.is_storage(x)
        override = self.backward_override()
        # the columnwise copies feed the quantized backward GEMMs only
        x_cols = ctx.weight_requires_grad and override is None
        if self._gathers_input:
            xq, x_local = self._gather_quantized(x, ctx.input_quantizer, "input", rowwise=True,
                                                 columnwise=x_cols)
            ctx.saved_input_gathered = x_local is None
            x_saved = xq if x_local is None else x_local
            if override == "dequantized" and x_local is None:  # backward gathers the local rows
                x_saved = ctx.input_quantizer.quantize_storage(
                    _quantized.as_high_precision(x), op=type(self).__name__)
                ctx.saved_input_gathered = False
        else:
            if ctx.input_was_quantized:  # the previous op emitted it quantized: no second cast
                xq = x
            else:
                xq = ctx.input_quantizer.quantize_storage(x, columnwise=x_cols,
                                                          op=type(self).__name__)
            x_saved = xq
        if isinstance(w, QuantizedTensor):  # a quantized weight: its own buffers, no recast
            wq = as_storage(w)
        else:
            wq = ctx.weight_quantizer.quantize_storage(w, columnwise=need_dgrad
                                                       and override is None,
                                                       op=type(self).__name__)
        epilogue = bias is not None or extra is not None or alpha != 1.0
        if extra is None and alpha == 1.0 and _fp8_gemm_fits(xq, wq, ctx.dtype):
            # the FP8 GEMM itself, with the bias epilogue (docs/quantization.md: how the CPU
            # multiplies)
            y = _fp8_gemm(xq._data, xq._scale_inv, xq._fp8_dtype, wq._data, wq._scale_inv,
                          wq._fp8_dtype, ctx.dtype, bias)
        elif not epilogue and _mx_rows(xq) is not None and _mx_rows(wq) is not None:
            y = _mxfp8_gemm(*_mx_rows(xq), *_mx_rows(wq), ctx.dtype)
        else:
            b32 = None if bias is None else bias.to(torch.float32)
            if extra is None:
                y = _linear_fwd(xq.dequantize_rowwise(), wq.dequantize_rowwise(), b32)
            else:
                y = _linear_fwd_add(xq.dequantize_rowwise(), wq.dequantize_rowwise(), b32,
                                    extra.to(torch.float32), alpha)
        if ctx.requires_grad:
            ctx.with_quantized_compute = override is None
            if override == "high_precision":  # the unquantized backward on the originals
                x_hp = _quantized.as_high_precision(x)
                w_hp = w.dequantize(dtype=ctx.dtype) if isinstance(w, QuantizedTensor) else w
                ctx.save_for_backward(
                    x_hp.to(ctx.dtype) if ctx.weight_requires_grad else None,
                    w_hp if need_dgrad else None)
            else:  # quantized buffers ("dequantized": dequantized for an unquantized backward)
                saved_x = x_saved.buffers() if ctx.weight_requires_grad else (None,) * 4
                saved_w = wq.buffers() if need_dgrad else (None,) * 4
                ctx.save_for_backward(*saved_x, *saved_w)
                # the split point: storages have 4 buffers (FP8, MXFP8) or 6 (NVFP4: + amaxes)
                ctx.quantized_meta = (x_saved.metadata(), wq.metadata(), len(saved_x))
        if extra is not None:
            return y
        return self.reduce_output(y if y.dtype == ctx.dtype else y.to(ctx.dtype))

    def op_backward(self, ctx: LinearContext, grad_output: torch.Tensor):
        return self.backward_grads(ctx, grad_output)

    def backward_grads(self, ctx: LinearContext, grad_output: torch.Tensor, *,
                       alpha: float = 1.0, grad_extra: Optional[torch.Tensor] = None):
        """dx = grad_extra + alpha * dy W and dW = alpha * dy^T x, each only when needed.
        ``alpha`` serves BackwardLinearScale and ``grad_extra`` BackwardLinearAdd."""
        if ctx.with_quantized_compute:
            return self._quantized_backward(ctx, grad_output, alpha=alpha, grad_extra=grad_extra)
        dx, dw, _ = self._backward(ctx, grad_output, alpha, grad_extra, None)
        return dx, (dw,)

    def backward_grads_and_dbias(self, ctx: LinearContext, grad_output: torch.Tensor,
                                 bias_dtype: Optional[torch.dtype]):
        """BackwardLinearBias (unquantized): ``(dx, dW, dbias)`` with dbias the sum of dy over
        its leading dims in ``bias_dtype`` (None: no dbias), one op call when dx and dW are both
        needed (without tensor parallelism). dbias is the following Bias' gradient: the sum of
        this rank's dy, before any gather."""
        return self._backward(ctx, grad_output, 1.0, None, bias_dtype)

    def _backward(self, ctx: LinearContext, grad_output: torch.Tensor, alpha: float,
                  grad_extra: Optional[torch.Tensor], bias_dtype: Optional[torch.dtype]):
        grad_output = _quantized.as_high_precision(grad_output)
        if ctx.quantized_meta is None:
            x, w = ctx.saved_tensors
        else:  # backward_override="dequantized": the saved quantized operands, dequantized
            saved, (x_meta, w_meta, n_x) = ctx.saved_tensors, ctx.quantized_meta
            x = (QuantizedTensorStorage.from_buffers(saved[:n_x], x_meta).dequantize_rowwise(
                ctx.dtype) if ctx.weight_requires_grad else None)
            w = (QuantizedTensorStorage.from_buffers(saved[n_x:], w_meta).dequantize_rowwise(
                ctx.dtype) if ctx.input_requires_grad else None)
        dy = grad_output if grad_output.dtype == ctx.dtype else grad_output.to(ctx.dtype)
        dx = db = None
        if self.tensor_parallel_mode is not None:
            dx, dw, db = self._parallel_backward(ctx, dy, x, w, alpha, grad_extra, bias_dtype)
        elif ctx.input_requires_grad and ctx.weight_requires_grad and grad_extra is None:
            # dgrad, wgrad (and dbias) in one op call
            dx, dw, db = _linear_bwd(dy, x, w, alpha, bias_dtype)
            if dx.dtype != ctx.input_dtype:
                dx = dx.to(ctx.input_dtype)
        else:
            if ctx.input_requires_grad:
                if grad_extra is None:
                    dx = _linear_dgrad(dy, w, alpha)
                else:
                    dx = _linear_dgrad_add(dy, w, grad_extra, alpha)
                if dx.dtype != ctx.input_dtype and grad_extra is None:
                    dx = dx.to(ctx.input_dtype)
            elif grad_extra is not None:
                dx = grad_extra
            dw = _linear_wgrad(dy, x, alpha) if ctx.weight_requires_grad else None
            if bias_dtype is not None:
                db = _bias_bwd(dy, bias_dtype)
        if bias_dtype is None:
            db = None
        if dw is not None and (self._accumulate_into_main_grad
                               or dw.dtype != self._parameters["weight"].dtype):
            dw = self._finish_wgrad(dw)
        return dx, dw, db

    def _parallel_backward(self, ctx: LinearContext, dy_local: torch.Tensor, x_local, w,
                           alpha: float, grad_extra: Optional[torch.Tensor],
                           bias_dtype: Optional[torch.dtype]):
        """The unquantized backward with tensor parallelism, communication overlapped with the
        GEMMs: the all-gathers of dy (row, sequence parallel) and of x (column, sequence
        parallel, for wgrad) start first; dx's reduction (column) starts after dgrad and runs
        during wgrad."""
        dy = self._start_gather(dy_local, "output gradient") if self._gathers_grad_output \
            else dy_local
        x = None
        if ctx.weight_requires_grad:
            x = self._start_gather(x_local, "input") if self._gathers_input else x_local
        db = _bias_bwd(dy_local, bias_dtype) if bias_dtype is not None else None
        dy = _comm.wait(dy)
        dx = None
        if ctx.input_requires_grad:
            if grad_extra is None:
                dx = _linear_dgrad(dy, w, alpha)
                if dx.dtype != ctx.input_dtype:
                    dx = dx.to(ctx.input_dtype)
            else:
                dx = _linear_dgrad_add(dy, w, grad_extra, alpha)
            dx = self._start_grad_input_reduction(dx)
        elif grad_extra is not None:
            dx = grad_extra
        dw = _linear_wgrad(dy, _comm.wait(x), alpha) if ctx.weight_requires_grad else None
        return _comm.wait(dx), dw, db

    def _finish_wgrad(self, dw: Optional[torch.Tensor]):
        """dW as the weight's gradient: added into ``weight.main_grad`` with
        accumulate_into_main_grad, else in the weight's dtype."""
        if dw is None:
            return None
        if self._accumulate_into_main_grad:
            return self._accumulate_main_grad(dw)
        weight_dtype = self._parameters["weight"].dtype
        return dw if dw.dtype == weight_dtype else dw.to(weight_dtype)

    def _quantized_backward(self, ctx: LinearContext, grad_output: torch.Tensor, *,
                            alpha: float, grad_extra: Optional[torch.Tensor]):
        saved = ctx.saved_tensors
        x_meta, w_meta, n_x = ctx.quantized_meta
        ctx.grad_output_was_quantized = _quantized.is_storage(grad_output)
        if self._gathers_grad_output:
            dyq, _ = self._gather_quantized(grad_output, ctx.grad_output_quantizer,
                                            "output gradient", rowwise=ctx.input_requires_grad,
                                            columnwise=ctx.weight_requires_grad)
        elif ctx.grad_output_was_quantized:  # the next op's backward emitted it quantized
            dyq = grad_output
        else:
            dyq = ctx.grad_output_quantizer.quantize_storage(grad_output,
                                                             rowwise=ctx.input_requires_grad,
                                                             columnwise=ctx.weight_requires_grad,
                                                             op=type(self).__name__)
        dx = None
        if ctx.input_requires_grad:
            wq = QuantizedTensorStorage.from_buffers(saved[n_x:], w_meta)
            fp8_dx = None
            if (grad_extra is None and alpha == 1.0 and isinstance(wq, Float8TensorStorage)
                    and isinstance(dyq, Float8TensorStorage)):
                # dx [rows, in] = dy [rows, out] @ W [out, in]: TN with dy row-wise and W
                # column-wise (W^T, [in, out]); k = out_features, n = in_features
                out_dtype = (ctx.input_dtype if ctx.input_dtype in _FP8_GEMM_OUT_DTYPES
                             else torch.float32)
                n, k = wq._data.shape[1], wq._data.shape[0]
                if _fp8_gemm_takes(dyq._data, dyq._fp8_dtype, wq._fp8_dtype, n, k, out_dtype):
                    fp8_dx = _fp8_gemm(dyq._data, dyq._scale_inv, dyq._fp8_dtype, _columnwise(wq),
                                       wq._scale_inv, wq._fp8_dtype, out_dtype)
            if (fp8_dx is None and grad_extra is None and alpha == 1.0
                    and _mx_rows(dyq) is not None and _mx_cols(wq) is not None):
                # dx [rows, in] = dy [rows, out] (blocks along out) x W^T's columnwise copy
                # [in, out] (blocks along out): TN
                out_dtype = (ctx.input_dtype if ctx.input_dtype in _FP8_GEMM_OUT_DTYPES
                             else torch.float32)
                fp8_dx = _mxfp8_gemm(*_mx_rows(dyq), *_mx_cols(wq), out_dtype)
            if fp8_dx is not None:
                dx = fp8_dx if fp8_dx.dtype == ctx.input_dtype else fp8_dx.to(ctx.input_dtype)
            else:
                w = wq.dequantize_columnwise()
                dy_row = dyq.dequantize_rowwise()
                if grad_extra is None:
                    dx = _linear_dgrad(dy_row, w, alpha).to(ctx.input_dtype)
                else:
                    dx = _linear_dgrad_add(dy_row, w, grad_extra, alpha)
            dx = self._start_grad_input_reduction(dx)
        elif grad_extra is not None:
            dx = grad_extra
        dw = None
        if ctx.weight_requires_grad:
            xq = QuantizedTensorStorage.from_buffers(saved[:n_x], x_meta)
            if self._gathers_input and not ctx.saved_input_gathered:
                xq = self._gather_fp8(xq, "input")
            if (alpha == 1.0 and isinstance(xq, Float8TensorStorage)
                    and isinstance(dyq, Float8TensorStorage) and xq._data.numel() != 0
                    and dyq._data.numel() != 0):
                # dW [out, in] = dy^T [out, rows] @ x [rows, in]: TN with dy column-wise
                # [out, rows] and x column-wise [in, rows]; k = rows, n = in_features
                n = xq._data.shape[-1]
                k = xq._data.numel() // n
                # written in the weight's dtype (one rounding) unless it accumulates into an
                # fp32 main_grad
                dw_dtype = (torch.float32 if self._accumulate_into_main_grad
                            else self._parameters["weight"].dtype)
                if dw_dtype not in _FP8_GEMM_OUT_DTYPES:
                    dw_dtype = torch.float32
                if _fp8_gemm_takes(dyq._data, dyq._fp8_dtype, xq._fp8_dtype, n, k, dw_dtype):
                    dw = _fp8_gemm(_columnwise(dyq), dyq._scale_inv, dyq._fp8_dtype,
                                   _columnwise(xq), xq._scale_inv, xq._fp8_dtype, dw_dtype)
            if dw is None and alpha == 1.0 and _mx_cols(dyq) is not None \
                    and _mx_cols(xq) is not None:
                # dW [out, in] = dy^T [out, rows] x x^T [in, rows], both blocked along rows: TN
                dw = _mxfp8_gemm(*_mx_cols(dyq), *_mx_cols(xq), torch.float32)
            if dw is None:
                dw = _linear_wgrad(dyq.dequantize_columnwise(), xq.dequantize_columnwise(), alpha)
        return _comm.wait(dx), (self._finish_wgrad(dw),)

    def _accumulate_main_grad(self, dw: torch.Tensor):
        return accumulate_main_grad(self.weight, dw, "BasicLinear", "weight")

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, out_features={self.out_features}"
        if self.tensor_parallel_mode is not None:
            text += (f", tensor_parallel_mode={self.tensor_parallel_mode!r}, "
                     f"tensor_parallel_size={self.tensor_parallel_size}, "
                     f"sequence_parallel={self.sequence_parallel}")
        return text
