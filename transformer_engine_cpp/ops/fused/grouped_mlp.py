"""The GroupedMLP fusion (ours): TransformerEngine's grouped-MLP pattern, a GroupedLinear, a
scaled activation and a GroupedLinear, as one forward and one backward step."""

from __future__ import annotations

from ..basic import GroupedLinear
from ..basic.activation import _ScaledActivation
from ..op import FusedOperation
from ._window import fuse_windows


class GroupedMLP(FusedOperation):
    """Forward-backward fusion of ``[GroupedLinear, scaled activation, GroupedLinear]`` (an
    expert MLP: fc1, ``scales * act(h)`` per row, fc2).

    TransformerEngine fuses this pattern only on Blackwell under MXFP8 / NVFP4 (its CuTe
    kernels); here it applies on every device: the three ops' custom ops run back to back in
    one pipeline step (each one call over all experts), and with the activation's
    ``activation_recompute_in_mlp`` fc2 does not keep the activation's output for its weight
    gradients: backward recomputes it from fc1's output, which the activation saves anyway.
    The basic ops' contexts are the unfused ones'.
    """

    def __init__(self, *, fc1: GroupedLinear, activation: _ScaledActivation,
                 fc2: GroupedLinear) -> None:
        super().__init__((fc1, activation, fc2))

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        fc1, act, fc2 = self.basic_ops
        ctx1, ctx_act, ctx2 = basic_op_ctxs
        extra1, extra_act, extra2 = basic_op_extra_inputs
        h, _ = fc1.fuser_forward([ctx1], input_, basic_op_extra_inputs=[extra1],
                                 basic_op_kwargs=[{}])
        scales = extra_act[0]
        if ctx_act.requires_grad:  # the activation's own forward, as its context expects it
            ctx_act.scales_requires_grad = ctx_act.extra_inputs_requires_grad[0]
            ctx_act.save_for_backward(h, scales)
        a = act._fwd_op(h, scales, *act._op_args())
        y, _ = fc2.fuser_forward([ctx2], a, basic_op_extra_inputs=[extra2], basic_op_kwargs=[{}])
        if act.activation_recompute_in_mlp and ctx2.to_save is not None:
            saved = list(ctx2.to_save)
            ctx2.recompute_input = saved[1] is not None
            saved[1] = None  # fc2's input (the activation's output): recomputed in backward
            ctx2.to_save = tuple(saved)
        return y, [(), (), ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        fc1, act, fc2 = self.basic_ops
        ctx1, ctx_act, ctx2 = basic_op_ctxs
        if getattr(ctx2, "recompute_input", False):
            h, scales = ctx_act.saved_tensors
            a = act._fwd_op(h, scales, *act._op_args()).reshape(-1, fc2.in_features)
            saved = list(ctx2.saved_tensors)
            saved[1] = a if a.dtype == ctx2.dtype else a.to(ctx2.dtype)
            ctx2.saved_tensors = tuple(saved)
        da, grads2, extra_grads2 = fc2.fuser_backward([ctx2], grad_output,
                                                      basic_op_grad_extra_outputs=[()])
        # the backward stops where the unfused ops' would: before the first op it does not
        # reach (which saved nothing)
        dx, grads_act, extra_grads_act = None, [()], [(None,)]
        grads1 = [tuple(None for p in fc1._parameters.values() if p is not None)]
        extra_grads1 = [(None,)]
        if ctx_act.requires_grad:
            dh, grads_act, extra_grads_act = act.fuser_backward(
                [ctx_act], da, basic_op_grad_extra_outputs=[()])
            if ctx1.requires_grad:
                dx, grads1, extra_grads1 = fc1.fuser_backward([ctx1], dh,
                                                              basic_op_grad_extra_outputs=[()])
        return (dx, [grads1[0], grads_act[0], grads2[0]],
                [extra_grads1[0], extra_grads_act[0], extra_grads2[0]])


def fuse_grouped_mlp(ops: list, *, recipe=None) -> list:
    """``[GroupedLinear, scaled activation, GroupedLinear]`` -> GroupedMLP, with fc1's output
    features feeding the activation (twice the activation's for a gated one) and the
    activation's output feeding fc2."""
    def match(ops, i):
        if i + 2 >= len(ops):
            return None
        fc1, act, fc2 = ops[i:i + 3]
        if not (type(fc1) is GroupedLinear and isinstance(act, _ScaledActivation)
                and type(fc2) is GroupedLinear):
            return None
        act_out = fc1.out_features // 2 if act.gated else fc1.out_features
        if fc2.in_features != act_out or fc1.num_groups != fc2.num_groups:
            return None
        return GroupedMLP(fc1=fc1, activation=act, fc2=fc2), 3

    return fuse_windows(ops, match)
