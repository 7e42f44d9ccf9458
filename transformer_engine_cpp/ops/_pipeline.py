"""The pipeline Function: one ``torch.autograd.Function`` that runs a fuser's forward plan
and, in backward, its backward plan in reverse.

``PipelineFunction.apply(plan, basic_op_kwargs, arg_layout, *tensors)``: ``tensors`` holds the
input, the parameters and the public extra inputs, de-duplicated by identity; ``arg_layout``
is ``(input_pos, param_pos, extra_pos)``, their positions in ``tensors`` (``param_pos`` per
basic op); ``basic_op_kwargs`` is None when no op has any. Eager mode and ``torch.compile``
run the same forward and backward: under compile the Function is traced as one higher-order
op (its forward and backward call only ``torch.ops.te_cpp.*``, torch ops and Python on
constants), and the few eager-only steps (guarding in-place writes, releasing saved tensors
early, delayed-scaling updates) are skipped there.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import _torch_shim
from ._common import shares_storage, storage_address
from ._plan import traced_plan
from ._quantized import as_high_precision, grad_output_quantizer_for, public
from ..quantization.tensor import QuantizedTensorStorage

_new_object = object.__new__


def _save_contexts(func_ctx, ctxs: list) -> None:
    """Save every context's tensors through the Function, as one flat list; each context
    records its range in it (``saved_range``) and the range among the packed tensors, which
    skips the None slots (``packed_range``, for early release)."""
    to_save = []
    packed = 0
    for ctx in ctxs:
        saved = ctx.to_save
        if saved is None:
            ctx.saved_range = ctx.packed_range = (0, 0)
            continue
        start, first_packed = len(to_save), packed
        to_save.extend(saved)
        for t in saved:
            if t is not None:
                packed += 1
        ctx.saved_range = (start, len(to_save))
        ctx.packed_range = (first_packed, packed)
        ctx.to_save = None
    func_ctx.save_for_backward(*to_save)


def pipeline_forward(func_ctx, plan, basic_op_kwargs, arg_layout, *tensors):
    """The forward plan. ``func_ctx`` is None when nothing needs a gradient (no autograd)."""
    compiling = torch.compiler.is_compiling()
    # traced: the plan's fields as constants (one guard on the plan, not one per field)
    view = traced_plan(plan) if compiling else plan
    basic_ops, routing = plan.basic_ops, plan.routing
    input_pos, _, extra_pos = arg_layout
    x = tensors[input_pos]
    # one context per basic op, of the class the op declares, with its flags: whether the
    # backward reaches the op and whether its input needs a gradient
    if compiling:
        first = view.first_op_requiring_backward
        # (the classes from the plan, not the constant view: the backward copies the
        # contexts, and copy.copy looks up the class, which a constant cannot have guarded)
        ctxs = [cls(requires_grad=i >= first, input_requires_grad=i > first)
                for i, cls in enumerate(plan.context_types)]
    else:  # the defaults are class attributes: no __init__ call, only the overrides set
        ctxs = [_new_object(cls) for cls in plan.context_types]
        for i, rg, irg in plan.context_flag_overrides:
            ctx = ctxs[i]
            ctx.requires_grad = rg
            ctx.input_requires_grad = irg
    if ctxs:
        ctxs[0].input_requires_grad = func_ctx is not None and x.requires_grad
    has_extras = view.has_extra_tensors
    if has_extras:
        extra_inputs = [
            [tensors[extra_pos[src[1]]] if src[0] == "public" else None for src in sources]
            for sources in routing.extra_input_sources
        ]
        extra_outputs: list[Optional[tuple]] = [None] * len(basic_ops)

    for step, op in zip(view.forward_steps, plan.forward_step_ops):
        op_extra_inputs = step.no_extra_inputs
        if step.has_extra_inputs:
            for i, slot, p_op, p_slot in step.channel_fills:
                extra_inputs[i][slot] = extra_outputs[p_op][p_slot]
            op_extra_inputs = [tuple(extra_inputs[i]) for i in step.idxs]
            for i, flags in step.extra_inputs_requires_grad:
                ctxs[i].extra_inputs_requires_grad = tuple(
                    (func_ctx is not None and t is not None and t.requires_grad)
                    if rg is None else rg
                    for rg, t in zip(flags, extra_inputs[i]))
            if step.in_place_writes and not compiling:
                for k, slot in step.in_place_writes:
                    target = op_extra_inputs[k][slot]
                    if target.is_leaf and target.requires_grad and _torch_shim.in_backward():
                        _refuse_write_into_a_leaf(basic_ops[step.idxs[k]])
                    _protect_from_write(target, ctxs[:step.start], extra_outputs,
                                        step.outputs_read_after)
        prev_q = next_q = None
        if view.quantized:
            if step.dequantize_input:
                x = as_high_precision(x)
            # a backward_override leaves the backward unquantized: no op hands dx back
            # quantized
            if step.prev_idx is not None and view.backward_override is None:
                prev_q = grad_output_quantizer_for(basic_ops[step.prev_idx],
                                                   ctxs[step.prev_idx])
            if step.next_idx is not None:
                next_q = basic_ops[step.next_idx].get_input_quantizer()
                # the columnwise copies feed backward GEMMs: none for an op the backward
                # does not reach (no_grad, inference, nothing before it trained), the op
                # that reads them (past a Quantize that hands them on)
                if (next_q is not None and step.reader_idx is not None
                        and not ctxs[step.reader_idx].requires_grad):
                    next_q = next_q.usage_variant(rowwise=True, columnwise=False)
        if basic_op_kwargs is not None:
            kwargs = basic_op_kwargs[step.start:step.stop]
        elif compiling:
            kwargs = [{} for _ in step.idxs]
        else:
            kwargs = step.no_kwargs
        x, op_extra_outputs = op.fuser_forward(
            ctxs[step.start:step.stop], x,
            basic_op_extra_inputs=op_extra_inputs,
            prev_op_grad_output_quantizer=prev_q,
            next_op_input_quantizer=next_q,
            basic_op_kwargs=kwargs,
        )
        if step.has_extra_outputs:
            _collect_extra_outputs(step, op, basic_ops, routing, op_extra_outputs,
                                   extra_outputs)
        elif len(op_extra_outputs) != len(step.idxs) or any(op_extra_outputs):
            _check_no_extra_outputs(step, op, op_extra_outputs)

    public_outputs = None
    if has_extras and routing.public_extra_outputs:
        public_outputs = _distinct_outputs(
            x, [extra_outputs[i][slot] for i, slot in routing.public_extra_outputs])
    if func_ctx is not None:
        _save_contexts(func_ctx, ctxs)
        func_ctx.plan = plan
        func_ctx.basic_op_ctxs = ctxs
        func_ctx.arg_layout = arg_layout
        func_ctx.num_tensors = len(tensors)
    if isinstance(x, QuantizedTensorStorage) and not isinstance(x, torch.Tensor):
        x = public(x)  # (the check inlined: this runs on every call)
    if public_outputs:
        return (x, *public_outputs)
    return x


def _per_basic_op(step, op, results, what: str, method: str) -> list:
    """``results`` as a list with one entry per basic op of the group (``op``'s), or a
    RuntimeError naming the op's method that returned another count."""
    results = list(results)
    if len(results) != len(step.idxs):
        raise RuntimeError(f"{op.__class__.__name__}.{method} returned {what} for "
                           f"{len(results)} basic ops, expected {len(step.idxs)}")
    return results


def _collect_extra_outputs(step, op, basic_ops, routing, op_extra_outputs,
                           extra_outputs) -> None:
    """Check one group's extra outputs (one tuple per basic op, None only where nothing
    outside the group reads it) and record them."""
    op_extra_outputs = _per_basic_op(step, op, op_extra_outputs, "extra outputs",
                                     "fuser_forward")
    for i, outs in zip(step.idxs, op_extra_outputs):
        outs = tuple(outs)
        name = basic_ops[i].__class__.__name__
        if len(outs) != basic_ops[i].num_extra_outputs:
            raise RuntimeError(f"{name} returned {len(outs)} extra outputs, expected "
                               f"{basic_ops[i].num_extra_outputs}")
        for slot, t in enumerate(outs):
            if t is not None:
                continue
            if (i, slot) in routing.public_output_index:
                raise RuntimeError(f"{name}: extra output {slot} is public, but the op "
                                   "returned None")
            if any(not step.start <= c_op < step.stop
                   for c_op, _ in routing.consumers.get((i, slot), ())):
                raise RuntimeError(f"{name}: extra output {slot} returned None but is "
                                   "consumed outside its forward fusion")
        extra_outputs[i] = outs


def _check_no_extra_outputs(step, op, op_extra_outputs) -> None:
    """A group without extra outputs returns an empty tuple per basic op."""
    op_extra_outputs = _per_basic_op(step, op, op_extra_outputs, "extra outputs",
                                     "fuser_forward")
    if any(len(outs) for outs in op_extra_outputs if outs):
        raise RuntimeError(
            f"{op.__class__.__name__}.fuser_forward returned extra outputs for basic "
            "ops that have none"
        )


def _refuse_write_into_a_leaf(op) -> None:
    """A forward during a backward pass is a recompute (torch.utils.checkpoint's), whose input
    is a leaf that requires grad: an in-place write into it (as plain PyTorch refuses one) means
    the checkpointed forward wrote its output into the input the recompute reads back."""
    raise RuntimeError(
        f"{type(op).__name__}(in_place=True) writes into a leaf tensor that requires grad "
        "during a backward pass: inside torch.utils.checkpoint(use_reentrant=True) the forward "
        "wrote its output into the checkpointed function's input, which the recompute reads "
        "back, so the gradients would be wrong. Use in_place=False in checkpointed regions.")


def _protect_from_write(target, ctxs, extra_outputs, outputs_read_after) -> None:
    """Eager in-place writes (AddExtraInput(in_place=True) and its fusions) overwrite
    ``target``. Whatever still needs its current values gets a copy first: tensors that earlier
    ops saved for backward (autograd's version check cannot see a write made before they are
    saved), and earlier extra outputs that are returned or consumed after the write. The write
    itself still lands in the caller's buffer."""
    for ctx in ctxs:
        saved = ctx.to_save
        if saved and any(shares_storage(t, target) for t in saved):
            ctx.to_save = tuple(t.clone() if shares_storage(t, target) else t for t in saved)
    for i, slot in outputs_read_after:
        outs = extra_outputs[i]
        if outs is not None and shares_storage(outs[slot], target):
            extra_outputs[i] = outs[:slot] + (outs[slot].clone(),) + outs[slot + 1:]


def _distinct_outputs(x: torch.Tensor, outputs: list) -> list:
    """The public extra outputs, each a distinct tensor object: one that is the main output or
    an earlier extra output (MakeExtraOutput returns its input) is returned as a view of it.
    A Function that returns one tensor twice cannot be traced (Dynamo loses the second)."""
    seen = {id(x)}
    result = []
    for t in outputs:
        if id(t) in seen:
            t = t.view_as(t)
        seen.add(id(t))
        result.append(t)
    return result


def pipeline_backward(func_ctx, grad_output, *grad_public_outputs):
    """The backward plan, in reverse."""
    plan = func_ctx.plan
    basic_ops, routing = plan.basic_ops, plan.routing
    input_pos, param_pos, extra_pos = func_ctx.arg_layout
    compiling = torch.compiler.is_compiling()

    # The contexts are written below. A traced forward's are copied (compile rule); eager
    # ones only when the graph is kept for another backward, which needs them as they are.
    ctxs = func_ctx.basic_op_ctxs
    boxes = None
    if compiling:
        ctxs = [copy.copy(ctx) for ctx in ctxs]
    elif _torch_shim.keep_graph():
        ctxs = [_copy_context(ctx) for ctx in ctxs]
    else:
        boxes = getattr(func_ctx, "saved_boxes", None)
    saved = func_ctx.saved_tensors
    for ctx in ctxs:
        start, end = ctx.saved_range
        ctx.saved_tensors = saved[start:end]
    del saved

    view = traced_plan(plan) if compiling else plan
    has_extras = view.has_extra_tensors
    if has_extras:
        # grads of extra outputs: the caller's (public) plus those from channel consumers
        grad_extra_outputs = [[None] * op.num_extra_outputs for op in basic_ops]
        for (i, slot), g in zip(routing.public_extra_outputs, grad_public_outputs):
            grad_extra_outputs[i][slot] = g
    grads: list[Optional[torch.Tensor]] = [None] * func_ctx.num_tensors
    # Grads an in-place accumulation must not write into (eager), by storage (a view shares
    # its base's): the caller's and any routed to more than one extra output (``shared``), and
    # those returned for an extra input or a parameter (``grads``).
    shared = routed = None
    if has_extras and not compiling:
        shared = {storage_address(t) for t in (grad_output, *grad_public_outputs)}
        routed = set()

    dx = grad_output
    for step, op in zip(view.backward_steps, plan.backward_step_ops):
        if not step.requires_grad:
            dx = None
            break
        step_ctxs = ctxs[step.start:step.stop]
        if view.quantized and step.dequantize_grad_output:
            dx = as_high_precision(dx)
        grad_extras = step.no_grad_extra_outputs
        if step.has_extra_outputs:
            grad_extras = [tuple(grad_extra_outputs[i]) for i in step.idxs]
            if step.in_place_grad_slots and shared is not None:
                _mark_writable_grads(step, step_ctxs, grad_extra_outputs, shared, dx, grads)
        dx, op_param_grads, op_extra_input_grads = op.fuser_backward(
            step_ctxs, dx, basic_op_grad_extra_outputs=grad_extras)
        _add_param_grads(step, op, op_param_grads, param_pos, grads)
        if step.has_extra_inputs:
            _route_extra_input_grads(step, op, routing, op_extra_input_grads, extra_pos, grads,
                                     grad_extra_outputs, shared, routed)
        if boxes is not None:  # this step's saved tensors go now (see release_saved_early)
            for ctx in step_ctxs:
                ctx.saved_tensors = None
                start, end = ctx.packed_range
                for j in range(start, end):
                    boxes[j][0] = None

    if not compiling and plan.quantized:
        for op in basic_ops:  # delayed scaling: the backward scales' update (eager only)
            op.update_delayed_backward_state()
    if dx is not None:
        if isinstance(dx, QuantizedTensorStorage) and not isinstance(dx, torch.Tensor):
            dx = public(dx)
        grads[input_pos] = dx if grads[input_pos] is None else grads[input_pos] + dx
    return (None, None, None, *grads)


def _copy_context(ctx):
    """A shallow copy of an op context, by its ``__dict__``."""
    new = _new_object(type(ctx))
    new.__dict__.update(ctx.__dict__)
    return new


def _mark_writable_grads(step, step_ctxs, grad_extra_outputs, shared, dx, grads) -> None:
    """Tell the group's ops which extra-output grads they may accumulate into in place: only
    one that nothing else holds (neither the caller, another destination, ``dx``, nor a grad
    already returned)."""
    for k, slot in step.in_place_grad_slots:
        ctx = step_ctxs[k]
        g = grad_extra_outputs[step.idxs[k]][slot]
        writable = list(ctx.writable_grad_extra_outputs
                        or (False,) * len(grad_extra_outputs[step.idxs[k]]))
        ptr = storage_address(g)
        writable[slot] = (ptr is not None and ptr not in shared and not shares_storage(g, dx)
                          and not any(shares_storage(g, t) for t in grads))
        ctx.writable_grad_extra_outputs = tuple(writable)


def _add_param_grads(step, op, op_param_grads, param_pos: tuple, grads: list) -> None:
    """Check what one backward step returned for parameters (a sequence per basic op of the
    group, one grad per parameter; an op without parameters may return all-None grads) and add
    the grads into ``grads`` at their argument positions."""
    if not isinstance(op_param_grads, (tuple, list)) or len(op_param_grads) != len(step.idxs):
        op_param_grads = _per_basic_op(step, op, op_param_grads, "parameter grads",
                                       "fuser_backward")
    for i, pgrads in zip(step.idxs, op_param_grads):
        positions = param_pos[i]
        if not isinstance(pgrads, (tuple, list)):
            pgrads = () if pgrads is None else tuple(pgrads)
        if len(pgrads) != len(positions):
            if not positions and not any(g is not None for g in pgrads):
                continue
            basic_op = op.basic_ops[i - step.start] if op.is_fused_op else op
            raise RuntimeError(
                f"{basic_op.__class__.__name__} returned {len(pgrads)} parameter grads, "
                f"expected {len(positions)}"
            )
        for pos, g in zip(positions, pgrads):
            if g is not None:
                prev = grads[pos]
                grads[pos] = g if prev is None else prev + g


def _route_extra_input_grads(step, op, routing, op_extra_input_grads, extra_pos, grads,
                             grad_extra_outputs, shared, routed) -> None:
    """Send each extra-input grad to its source: the caller's extra input (summed with any
    earlier one) or the producing op's extra-output grad, when the producer is in an earlier
    group."""
    op_extra_input_grads = _per_basic_op(step, op, op_extra_input_grads, "extra-input grads",
                                         "fuser_backward")
    for i, egrads in zip(step.idxs, op_extra_input_grads):
        egrads = tuple(egrads) if egrads is not None else ()
        for slot, src in enumerate(routing.extra_input_sources[i]):
            g = egrads[slot] if slot < len(egrads) else None
            if g is None:
                continue
            if src[0] == "public":
                pos = extra_pos[src[1]]
                grads[pos] = g if grads[pos] is None else grads[pos] + g
            elif not step.start <= src[1] < step.stop:  # produced outside the group
                prev = grad_extra_outputs[src[1]][src[2]]
                grad_extra_outputs[src[1]][src[2]] = g if prev is None else prev + g
                if shared is not None:
                    ptr = storage_address(g)
                    if ptr in routed:
                        shared.add(ptr)
                    routed.add(ptr)


class PipelineFunction(torch.autograd.Function):
    """Runs a fuser's plan: :func:`pipeline_forward`, then :func:`pipeline_backward`."""

    forward = staticmethod(pipeline_forward)

    @staticmethod
    def backward(func_ctx, grad_output, *grad_public_outputs):
        if torch.is_grad_enabled():  # create_graph=True: once_differentiable's error graph
            return _backward_once_differentiable(func_ctx, grad_output, *grad_public_outputs)
        return pipeline_backward(func_ctx, grad_output, *grad_public_outputs)


_backward_once_differentiable = once_differentiable(pipeline_backward)

#: PipelineFunction's C++ apply (eager calls outside functorch transforms).
apply_eager = _torch_shim.c_apply(PipelineFunction)

#: Inputs with at least this many elements release each op's saved tensors early.
RELEASE_MIN_NUMEL = 1 << 16


def release_saved_early(apply, *args):
    """``apply(*args)`` with the pipeline's saved tensors packed in boxes that the backward
    empties step by step, so each op's saved tensors are freed once its backward has run, as
    autograd frees a node's (``save_for_backward`` alone keeps them until the whole backward
    ends). The boxes chain any saved-tensor hooks the caller has installed."""
    if not _torch_shim.saved_tensors_hooks_enabled():
        return apply(*args)
    boxes: list[list] = []
    outer = _torch_shim.top_saved_tensors_hooks(False)
    if outer is None:
        def pack(t):
            box = [t]
            boxes.append(box)
            return box

        def unpack(box):
            return box[0]
    else:
        outer_pack, outer_unpack = outer

        def pack(t):
            box = [outer_pack(t)]
            boxes.append(box)
            return box

        def unpack(box):
            return outer_unpack(box[0])
    _torch_shim.push_saved_tensors_hooks(pack, unpack)
    try:
        out = apply(*args)
    finally:
        _torch_shim.pop_saved_tensors_hooks()
    grad_fn = (out[0] if isinstance(out, tuple) else out).grad_fn
    if grad_fn is not None:
        grad_fn.saved_boxes = boxes
    return out
