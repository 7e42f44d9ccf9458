"""Base classes of the fusible operations: OperationContext, FusibleOperation, BasicOperation
and FusedOperation (TransformerEngine's ``ops/op.py``).

A *basic* operation owns parameters and configuration and knows how to run its own forward and
backward through ``torch.ops.te_cpp.*`` custom ops. A *fused* operation stands for several
consecutive basic operations and runs them together, in the forward pass, the backward pass, or
both. Operations are composed with :class:`~transformer_engine_cpp.ops.Sequential` and run by
:class:`~transformer_engine_cpp.ops.fuser.OperationFuser`, which imports this module (not the
other way round: ``ops/fuser.py`` sets :attr:`FusibleOperation.fuser_class`).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import io
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from ..quantization import (FP8GlobalStateManager, RecipeState,
                            update_delayed_scaling)
from ..quantization.tensor import module_cast


def mark_constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)``: Dynamo calls ``fn`` while tracing and
    keeps its result as a constant, without tracing (or guarding) what it reads. The decorator
    only sets this attribute; setting it here keeps ``import torch._dynamo`` (about 1.5 s) out
    of our import (tests/test_compile.py checks that the two agree)."""
    fn._dynamo_marked_constant = True
    return fn


_COMPILE_UNSUPPORTED_ERROR: Optional[type] = None


def compile_unsupported_error() -> type:
    """The class ``CompileUnsupportedError``, defined on first use (it derives from a
    torch._dynamo class, and importing torch._dynamo takes about 1.5 s)."""
    global _COMPILE_UNSUPPORTED_ERROR  # pylint: disable=global-statement
    if _COMPILE_UNSUPPORTED_ERROR is None:
        import torch._dynamo.exc  # pylint: disable=import-outside-toplevel

        class CompileUnsupportedError(torch._dynamo.exc.UserError):
            """What cannot run under ``torch.compile`` (a DelayedScaling recipe, parameters
            still on the meta device, an op whose ``compile_unsupported_reason()`` says why),
            with what to do instead. A RuntimeError. The fuser raises it outside the traced
            code, from a function Dynamo runs at trace time, so that Dynamo passes it to the
            caller as it is (a UserError: "valid in eager, not supported in TorchDynamo"),
            with this message on the first line, under ``fullgraph=True`` and the default
            alike; raised inside the traced code it would reach the caller as ``Unsupported:
            Observed exception`` (or, without ``fullgraph``, become a graph break)."""

            def __init__(self, msg: str) -> None:
                super().__init__(torch._dynamo.exc.UserErrorType.INVALID_INPUT, msg)

        # importable as transformer_engine_cpp.ops.op.CompileUnsupportedError (pickle)
        CompileUnsupportedError.__module__ = __name__
        CompileUnsupportedError.__qualname__ = "CompileUnsupportedError"
        _COMPILE_UNSUPPORTED_ERROR = CompileUnsupportedError
    return _COMPILE_UNSUPPORTED_ERROR


def __getattr__(name: str):
    if name == "CompileUnsupportedError":
        return compile_unsupported_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass
class OperationContext:
    """State a basic operation keeps between its forward and backward passes.

    Operations call :meth:`save_for_backward` in the forward pass and read ``saved_tensors`` in
    the backward pass. A basic op that keeps more (flags, shapes, dtypes) declares a dataclass
    subclass with typed fields and immutable defaults as its ``context_type``; a user-defined
    op may also set attributes on this class freely.
    """

    to_save: Optional[tuple] = None
    saved_tensors: Optional[tuple] = None
    #: where this context's saved tensors lie in the pipeline's, and the same range counting
    #: only the tensors, not the None slots (set by the pipeline)
    saved_range: Optional[tuple[int, int]] = None
    packed_range: Optional[tuple[int, int]] = None
    #: whether the backward pass reaches this op (it is at or after the first op needing grad)
    requires_grad: bool = True
    #: whether this op's main input needs a gradient (set by the fuser)
    input_requires_grad: bool = True
    #: per extra input, whether it needs a gradient (set by the fuser: a public extra input
    #: by its requires_grad, one fed by a channel when its producer is at or after the first
    #: op needing backward, as TransformerEngine marks extra outputs)
    extra_inputs_requires_grad: tuple = ()
    #: per extra output, whether its grad may be overwritten in backward (set by the fuser in
    #: eager mode for ops whose in_place_grad_extra_outputs() names the slot: only a grad
    #: that nothing else holds, neither the caller nor another destination, is writable)
    writable_grad_extra_outputs: tuple = ()

    def save_for_backward(self, *tensors: Optional[torch.Tensor]) -> None:
        """Mark tensors (or ``None``) to be available as ``saved_tensors`` in backward."""
        self.to_save = tensors


class _OpOverloadRef:
    """A custom op's OpOverload (or OpOverloadPacket) as its qualified name, for pickling: the
    OpOverload objects hold C++ handles that do not pickle, and the registry resolves the name
    again on load."""

    __slots__ = ("name", "overload")

    def __init__(self, op) -> None:
        if isinstance(op, torch._ops.OpOverload):
            self.name, self.overload = op._schema.name, op._overloadname
        else:
            self.name, self.overload = op._qualified_op_name, None

    def resolve(self):
        namespace, name = self.name.split("::")
        packet = getattr(getattr(torch.ops, namespace), name)
        return packet if self.overload is None else getattr(packet, self.overload)


_OP_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)
_PROCESS_GROUP = dist.ProcessGroup if dist.is_available() else ()


class FusibleOperation(torch.nn.Module, metaclass=abc.ABCMeta):
    """An operation the fuser can run, alone or fused with its neighbours.

    Pickling (``torch.save(model)``, ``pickle``) and ``copy.deepcopy`` keep an op's
    configuration, parameters and buffers; what is derived from them (the attributes named in
    ``_derived_state``: the one-op fuser, caches) is reset to None and rebuilt on use. Custom
    ops kept as attributes are saved by name. A process group cannot be pickled: pickling an op
    that holds one raises a TypeError naming the op; ``copy.deepcopy`` shares the group.
    """

    #: The fuser that runs an op called on its own (``op(x)``): OperationFuser, set on import
    #: of ``ops/fuser.py``.
    fuser_class: Optional[type] = None
    #: Attributes a pickle or deepcopy resets to None, rebuilt on use (classes add their own).
    _derived_state: tuple = ("_single_op_fuser",)
    #: Whether ``fuser_forward`` takes its input in quantized storage form (what a Quantize
    #: hands on, or a previous op quantized with this op's input quantizer). The pipeline
    #: dequantizes a quantized input for an op that does not, as TransformerEngine's
    #: QuantizedTensor falls back to its dequantization in an op that cannot use it.
    accepts_quantized_input: bool = False
    #: The same for ``fuser_backward``'s grad_output.
    accepts_quantized_grad_output: bool = False
    #: Whether the op hands its input on as it is (Quantize, Identity): the copies of a
    #: quantized input it is handed serve the op after it.
    passes_input_on: bool = False

    def _copy_state(self, *, for_pickle: bool) -> dict:
        """The ``__dict__`` a pickle or deepcopy carries (see the class docstring)."""
        state = {}
        for key, value in self.__dict__.items():
            if key in self._derived_state:
                value = None
            elif isinstance(value, _OP_TYPES):
                value = _OpOverloadRef(value)
            elif for_pickle and isinstance(value, _PROCESS_GROUP):
                raise TypeError(
                    f"{type(self).__name__}: cannot pickle an op that holds a process group "
                    f"({key}): a torch.distributed ProcessGroup belongs to the running "
                    "process. Save the model's state_dict() instead and load it into a model "
                    "built with the process group of the loading process")
            state[key] = value
        return state

    def __getstate__(self) -> dict:
        return self._copy_state(for_pickle=True)

    def __setstate__(self, state: dict) -> None:
        state = {k: v.resolve() if isinstance(v, _OpOverloadRef) else v
                 for k, v in state.items()}
        super().__setstate__(state)

    def __deepcopy__(self, memo: dict):
        """A deep copy sharing the process groups (see the class docstring)."""
        state = self._copy_state(for_pickle=False)
        for value in state.values():
            if isinstance(value, _PROCESS_GROUP):
                memo[id(value)] = value
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(state, memo))
        return new

    def _run_alone(self, input_, extra_inputs, basic_op_kwargs):
        """``op(x)``: a one-op fuser, built on the first call (the op's channels lock). Under
        torch.compile it is built at trace time outside Dynamo's view (a first call that
        found it missing would leave a guard that the next call fails)."""
        if torch.compiler.is_compiling():
            _build_single_op_fuser(self)
            fuser = self._single_op_fuser
        else:
            fuser = self.__dict__.get("_single_op_fuser")
            if fuser is None:
                fuser = self.__dict__["_single_op_fuser"] = self.fuser_class([self])
        return fuser(input_, *extra_inputs, basic_op_kwargs=basic_op_kwargs)

    @property
    @abc.abstractmethod
    def is_fused_op(self) -> bool:
        """Whether this op stands for several basic ops."""

    def pre_first_fuser_forward(self) -> None:
        """Hook run once, the first time a fuser builds a plan containing this op."""

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:  # pylint: disable=unused-argument
        """Hook run before every fuser forward pass."""

    def get_input_quantizer(self):
        """Quantizer the previous op may use to emit its output already quantized."""
        return None

    def get_grad_output_quantizer(self):
        """Quantizer the next op may use to emit its grad-input already quantized."""
        return None

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, Iterable[Iterable[torch.Tensor]]]:
        """Forward pass: returns ``(output, extra_outputs_per_basic_op)``."""
        raise NotImplementedError(
            f"Forward pass is not implemented for operation ({self.__class__.__name__})"
        )

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[
        Optional[torch.Tensor],
        Iterable[Iterable[Optional[torch.Tensor]]],
        Iterable[Iterable[Optional[torch.Tensor]]],
    ]:
        """Backward pass: returns ``(grad_input, grad_params_per_basic_op,
        grad_extra_inputs_per_basic_op)``."""
        raise NotImplementedError(
            f"Backward pass is not implemented for operation ({self.__class__.__name__})"
        )

    def compile_unsupported_reason(self) -> Optional[str]:
        """Why this op cannot run inside ``torch.compile``, or ``None`` if it can."""
        return None


# Why DelayedScaling cannot be compiled, and what to use instead.
DELAYED_SCALING_UNDER_COMPILE = (
    "DelayedScaling cannot be compiled; use Float8CurrentScaling or MXFP8BlockScaling "
    "(or Float8BlockScaling, NVFP4BlockScaling) under torch.compile, or run the model "
    "eagerly. DelayedScaling keeps amax histories and scales that every call reads and updates "
    "outside the graph (process-wide state).")

# The recipe states an op keeps (per recipe settings); the oldest goes first.
_MAX_RECIPE_STATES = 16


@mark_constant_result
def _build_single_op_fuser(op: FusibleOperation) -> bool:
    """Builds ``op``'s one-op fuser if missing. Dynamo runs it at trace time and keeps its
    result as a constant, so the check leaves no guard."""
    if op.__dict__.get("_single_op_fuser") is None:  # None in a copy (see _derived_state)
        op.__dict__["_single_op_fuser"] = op.fuser_class([op])
    return True


class BasicOperation(FusibleOperation, metaclass=abc.ABCMeta):
    """A single operation with its own parameters and state.

    Subclasses implement :meth:`op_forward` and :meth:`op_backward` with ``torch.ops.te_cpp``
    custom ops (or plain torch ops). Ops with extra inputs or outputs override
    :meth:`fuser_forward` / :meth:`fuser_backward` instead.
    """

    #: Number of extra tensor inputs (beyond the main input).
    num_extra_inputs: int = 0
    #: Number of extra tensor outputs (beyond the main output).
    num_extra_outputs: int = 0
    #: Whether the op takes per-call keyword arguments (``op_kwargs`` of Sequential). The
    #: built-in ops take none and the fuser rejects any with a ValueError naming the op;
    #: user-defined ops accept them by default.
    accepts_forward_kwargs: bool = True
    #: The class of the context the pipeline creates for this op on every forward; an op that
    #: keeps more than tensors between its passes declares a subclass with typed fields.
    context_type: type = OperationContext
    #: The recipe states and their quantizers are rebuilt by the next quantized call; a pickle or
    #: deepcopy keeps delayed scaling's scales and amax histories as pending state (as
    #: ``set_extra_state`` does), applied when that state is built.
    _derived_state = (*FusibleOperation._derived_state, "_fp8_metas", "_quantizers",
                      "_recipe_states")

    def __init__(self) -> None:
        super().__init__()
        self._extra_input_channels: list[Optional[str]] = [None] * self.num_extra_inputs
        self._extra_output_channels: list[Optional[str]] = [None] * self.num_extra_outputs
        self._extra_output_to_caller: list[bool] = [True] * self.num_extra_outputs
        self._extra_tensor_channels_locked = False
        self._fp8_metas = None
        self._quantizers = None

    @property
    def is_fused_op(self) -> bool:
        return False

    def in_place_extra_inputs(self) -> tuple:
        """The extra-input slots this op overwrites in eager forward (``in_place=True``). Before
        such a write the fuser copies whatever still needs the old values (tensors saved by
        earlier ops, extra outputs read later)."""
        return ()

    def in_place_grad_extra_outputs(self) -> tuple:
        """The extra-output slots whose grad this op may accumulate into in eager backward; the
        fuser says per call which of those grads are writable
        (``OperationContext.writable_grad_extra_outputs``)."""
        return ()

    def materialize_meta_parameters(self, *, requires_grad: bool) -> None:  # pylint: disable=unused-argument
        """A ``pre_fuser_forward`` for deferred initialisation: parameters still on the meta
        device are materialised (``reset_parameters``) before the first forward. Ops whose
        hook is exactly this one let the fuser skip the call while no parameter is on meta."""
        for p in self._parameters.values():
            if p is not None and p.is_meta:
                self.reset_parameters()
                return

    def _copy_state(self, *, for_pickle: bool) -> dict:
        state = super()._copy_state(for_pickle=for_pickle)
        pending = self._delayed_scaling_state()
        if pending:
            state["_pending_fp8_state"] = pending
        return state

    def _apply(self, fn, recurse=True):
        """Module casts (``.half()``, ``.to(dtype)``) keep quantized parameters quantized and
        change their nominal dtype (TransformerEngine's rule): the conversions inside are
        marked as a module cast."""
        with module_cast():
            return super()._apply(fn, recurse)

    # ---- extra-tensor channels ---------------------------------------------------------------

    def extra_input_channels(self) -> tuple:
        """Per extra input, the channel that feeds it (None: a public input)."""
        return tuple(self._extra_input_channels)

    def extra_output_channels(self) -> tuple:
        """Per extra output, the channel it is published on (None: none)."""
        return tuple(self._extra_output_channels)

    def extra_outputs_to_caller(self) -> tuple:
        """Per extra output, whether it is returned to the caller."""
        return tuple(self._extra_output_to_caller)

    def lock_extra_tensor_channels(self) -> None:
        """Freeze the channel routing: a fuser has captured it (further changes raise)."""
        self._extra_tensor_channels_locked = True

    def _check_channel_change(self, kind: str, index: int, count: int, channel) -> None:
        if self._extra_tensor_channels_locked:
            raise RuntimeError(
                f"{self.__class__.__name__}: cannot change extra {kind} channel {index}: an "
                "OperationFuser has already captured its channel routing"
            )
        if not 0 <= index < count:
            raise IndexError(
                f"{self.__class__.__name__}: extra {kind} index {index} is out of range "
                f"(the op has {count} extra {kind}s)"
            )
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise ValueError(
                f"{self.__class__.__name__}: extra {kind} channel must be a non-empty string "
                f"or None, got {channel!r}"
            )

    def set_extra_input_channel(self, index: int, channel: Optional[str]) -> "BasicOperation":
        """Feed extra input ``index`` from the extra output published on ``channel`` by an
        earlier op of the same fuser (``None``: a public input given by the caller)."""
        self._check_channel_change("input", index, self.num_extra_inputs, channel)
        self._extra_input_channels[index] = channel
        return self

    def set_extra_output_channel(
        self, index: int, channel: Optional[str], *, output_to_caller: bool = True
    ) -> "BasicOperation":
        """Publish extra output ``index`` on ``channel`` for later ops of the same fuser; with
        ``output_to_caller=False`` it is not returned to the caller."""
        self._check_channel_change("output", index, self.num_extra_outputs, channel)
        if not isinstance(output_to_caller, bool):
            raise TypeError(
                f"{self.__class__.__name__}: output_to_caller must be a bool, got "
                f"{type(output_to_caller).__name__}"
            )
        self._extra_output_channels[index] = channel
        self._extra_output_to_caller[index] = True if channel is None else output_to_caller
        return self

    # ---- quantization ---------------------------------------------------------------------------

    def num_quantizers(self, mode: str) -> int:  # pylint: disable=unused-argument
        """Number of quantizers this op uses in ``mode`` ("forward" or "backward")."""
        return 0

    def get_quantizer_roles(self, mode: str) -> Optional[list]:  # pylint: disable=unused-argument
        """The ``QuantizerRole`` of each of this op's quantizers in ``mode`` (None: the recipe
        states assign tensor types by position: input, weight, output forward; grad_output,
        grad_input backward), as TransformerEngine's ops declare them."""
        return None

    def reset_recipe_state(self, *, recipe) -> None:
        """Make ``recipe``'s quantization state (``_fp8_metas``, ``_quantizers``) the current
        one (``None``: no quantization).

        The state is built on the first use of a recipe with these settings
        (:meth:`recipe_state`) and kept: switching back to those settings (training
        unquantized, evaluating under FP8, training again) finds the same objects, so a
        torch.compile graph traced with them stays valid. A recipe with other settings (format,
        power-of-2 scales, epsilon, ...) gets a state of its own; TransformerEngine instead
        keeps its quantizers while the recipe class is unchanged."""
        self._fp8_metas, self._quantizers = self.recipe_state(recipe)
        if "_pending_fp8_state" in self.__dict__:
            self._apply_pending_fp8_state()

    def recipe_state(self, recipe) -> tuple:
        """``(fp8_metas, quantizers)`` of this op for ``recipe``, built on first use and kept
        per :meth:`Recipe.state_key`; ``(None, None)`` without a recipe or quantizers."""
        if recipe is None:
            return None, None
        n_fwd, n_bwd = self.num_quantizers("forward"), self.num_quantizers("backward")
        if n_fwd == 0 and n_bwd == 0:
            return None, None
        cache = self.__dict__.get("_recipe_states")
        if cache is None:  # the first quantized call, or a copy (see _derived_state)
            cache = self.__dict__["_recipe_states"] = {}
        key = recipe.state_key()
        state = cache.get(key)
        if state is None:
            if len(cache) >= _MAX_RECIPE_STATES:  # e.g. a new lambda in each recipe object
                del cache[next(iter(cache))]
            states = {mode: RecipeState.create(recipe, mode=mode, num_quantizers=n,
                                               roles=self.get_quantizer_roles(mode))
                      for mode, n in (("forward", n_fwd), ("backward", n_bwd)) if n > 0}
            quantizers = {mode: st.make_quantizers() for mode, st in states.items()}
            # the one-copy variants of the quantizers a neighbour may emit with (the input's,
            # the grad-output's), made here, outside any trace: the pipeline and BasicLinear
            # hand them out where a backward GEMM reads only one of the copies, or none
            for qs in quantizers.values():
                if qs and qs[0] is not None:
                    qs[0].usage_variant(rowwise=True, columnwise=False)
                    qs[0].usage_variant(rowwise=False, columnwise=True)
            state = cache[key] = ({"recipe": recipe, **states}, quantizers)
        return state

    def backward_override(self) -> Optional[str]:
        """The active recipe's ``backward_override`` (None without a recipe): "high_precision"
        or "dequantized" make this op's backward unquantized (TransformerEngine's)."""
        metas = self._fp8_metas
        return None if metas is None else metas["recipe"].backward_override

    def register_delayed_scaling_states(self) -> None:
        """Delayed scaling: have this op's forward scales updated when the outermost
        te.autocast exits (the fuser calls this on every quantized call, as TransformerEngine
        registers its metas); the backward ones are updated after the backward pass
        (update_delayed_backward_state)."""
        metas = self._fp8_metas
        if metas is None or not metas["recipe"].delayed():
            return
        group = FP8GlobalStateManager.get_fp8_group()
        for mode in ("forward", "backward"):
            if mode in metas:
                metas[mode].amax_reduction_group = group
        if "forward" in metas:
            FP8GlobalStateManager.add_delayed_scaling_state(metas["forward"])

    def update_delayed_backward_state(self) -> None:
        """Delayed scaling: roll the backward amax history and update the backward scales once
        this op's backward pass has recorded its amaxes (TransformerEngine updates them after the
        backward of its first FP8 module)."""
        metas = self._fp8_metas
        if metas is None or not metas["recipe"].delayed() or "backward" not in metas:
            return
        update_delayed_scaling(metas["backward"])

    # ---- checkpointing of quantization state ------------------------------------------------

    def _delayed_scaling_state(self) -> dict:
        """Delayed scaling's scales and amax histories (per mode, copies), or the pending state
        not applied yet; empty for stateless recipes or no recipe."""
        metas = self._fp8_metas
        state = {}
        if metas is not None and metas["recipe"].delayed():
            for mode in ("forward", "backward"):
                if mode in metas:
                    state[f"{mode}_scale"] = metas[mode].scale.detach().clone()
                    state[f"{mode}_amax_history"] = metas[mode].amax_history.detach().clone()
        return state or dict(self.__dict__.get("_pending_fp8_state") or {})

    def get_extra_state(self) -> torch.Tensor:
        """Delayed-scaling state (per mode: scale and amax_history) serialized with torch.save
        into a uint8 tensor; empty for stateless recipes or no recipe (as TransformerEngine)."""
        state = self._delayed_scaling_state()
        if not state:
            return torch.empty(0, dtype=torch.uint8)

        buf = io.BytesIO()
        torch.save(state, buf)
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)

    def set_extra_state(self, state: Optional[torch.Tensor]) -> None:
        """Restores what get_extra_state saved (tensors only, loaded with weights_only=True).
        If no delayed-scaling recipe state exists yet, it is applied when one is built."""
        if state is None or state.numel() == 0:
            return

        loaded = torch.load(io.BytesIO(state.cpu().numpy().tobytes()), weights_only=True)
        self.__dict__["_pending_fp8_state"] = loaded
        self._apply_pending_fp8_state()

    def _apply_pending_fp8_state(self) -> None:
        pending = self.__dict__.get("_pending_fp8_state")
        metas = self._fp8_metas
        if pending is None or metas is None or not metas["recipe"].delayed():
            return
        with torch.no_grad():
            for mode in ("forward", "backward"):
                if mode in metas and f"{mode}_scale" in pending:
                    metas[mode].scale.copy_(pending[f"{mode}_scale"])
                    hist = pending[f"{mode}_amax_history"]
                    if hist.shape == metas[mode].amax_history.shape:
                        metas[mode].amax_history.copy_(hist)
                    else:  # another amax_history_len: keep the most recent rows
                        n = min(hist.shape[0], metas[mode].amax_history.shape[0])
                        metas[mode].amax_history.zero_()
                        metas[mode].amax_history[:n].copy_(hist[:n])
        del self.__dict__["_pending_fp8_state"]

    def compile_unsupported_reason(self) -> Optional[str]:
        metas = self._fp8_metas
        if metas is not None and metas["recipe"].delayed():
            return DELAYED_SCALING_UNDER_COMPILE
        return None

    def get_quantizer(self, mode: str, index: int):
        if self._quantizers is None or mode not in self._quantizers:
            return None
        return self._quantizers[mode][index]

    def get_input_quantizer(self):
        if self.num_quantizers("forward") > 0:
            return self.get_quantizer("forward", 0)
        return None

    def get_grad_output_quantizer(self):
        if self.num_quantizers("backward") > 0:
            return self.get_quantizer("backward", 0)
        return None

    # ---- compute -------------------------------------------------------------------------------

    @abc.abstractmethod
    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Forward pass of this op alone."""

    @abc.abstractmethod
    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[Optional[torch.Tensor], Iterable[Optional[torch.Tensor]]]:
        """Backward pass of this op alone: ``(grad_input, grad_params)``."""

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer=None,
        next_op_input_quantizer=None,
        basic_op_kwargs,
    ):
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(
                f"{self.__class__.__name__} has extra tensor inputs or outputs and must "
                "override fuser_forward"
            )
        output = self.op_forward(
            basic_op_ctxs[0],
            input_,
            prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
            next_op_input_quantizer=next_op_input_quantizer,
            **basic_op_kwargs[0],
        )
        return output, [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(
                f"{self.__class__.__name__} has extra tensor inputs or outputs and must "
                "override fuser_backward"
            )
        grad_input, grad_params = self.op_backward(basic_op_ctxs[0], grad_output)
        return grad_input, [grad_params], [()]

    def forward(
        self, input: torch.Tensor, *extra_inputs: torch.Tensor, **kwargs: Any
    ):  # pylint: disable=redefined-builtin
        """Run this op alone through a one-op fuser."""
        return self._run_alone(input, extra_inputs, [kwargs])


class FusedOperation(FusibleOperation):
    """Several consecutive basic ops run together (in forward, backward or both).

    A forward-only (backward-only) fused op must leave the per-op contexts exactly as the
    unfused forward (backward) passes of its basic ops expect, so the other pass can run
    unfused. A backward runs when any of its basic ops is reached; it must skip the work of
    members whose context has ``requires_grad=False`` (before the first op needing backward).
    It holds no state of its own.
    """

    def __init__(self, basic_ops: Iterable[BasicOperation]) -> None:
        super().__init__()
        basic_ops = list(basic_ops)
        if len(basic_ops) == 0:
            raise ValueError(f"{self.__class__.__name__}: attempted to fuse an empty list of ops")
        for op in basic_ops:
            if not isinstance(op, BasicOperation):
                raise TypeError(
                    f"{self.__class__.__name__}: can only fuse BasicOperations, got "
                    f"{type(op).__name__}"
                )
        self.basic_ops = torch.nn.ModuleList(basic_ops)
        # the same ops as a plain tuple, for the per-call path (state_dict and the public API
        # use basic_ops)
        self._ops = tuple(basic_ops)

    @property
    def is_fused_op(self) -> bool:
        return True

    def get_input_quantizer(self):
        return self._ops[0].get_input_quantizer()

    def get_grad_output_quantizer(self):
        return self._ops[-1].get_grad_output_quantizer()

    def pre_first_fuser_forward(self) -> None:
        for op in self._ops:
            op.pre_first_fuser_forward()

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        for op in self._ops:
            op.pre_fuser_forward(requires_grad=requires_grad)

    def compile_unsupported_reason(self) -> Optional[str]:
        for op in self._ops:
            reason = op.compile_unsupported_reason()
            if reason is not None:
                return reason
        return None

    def forward(
        self,
        input: torch.Tensor,  # pylint: disable=redefined-builtin
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ):
        """Run this fused op alone through a one-op fuser."""
        return self._run_alone(input, extra_inputs, basic_op_kwargs)
