"""The fuser's behaviour: module groups, extra tensors and channels, op_kwargs, the cached plan
and its rebuild conditions, fusion registration, plan consistency, and their error cases."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.ops.fused import BackwardActivationBias, ForwardBiasActivation
from transformer_engine_cpp.ops.fuser import OperationFuser
from transformer_engine_cpp.testing import reference as ref

from harness import pair_fusion
from tolerances import tols

FP32 = tols(torch.float32)


def leaf(*shape, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def grads_of(*tensors):
    return [t.grad for t in tensors]


# ---- module groups ------------------------------------------------------------------------------


def test_module_groups_split_on_plain_modules():
    ops = lambda: te.ops.Identity()  # noqa: E731
    nn = lambda: torch.nn.Identity()  # noqa: E731
    seq = te.ops.Sequential(ops(), ops(), nn(), nn(), ops(), nn(), ops(), ops(), ops())
    seq(torch.randn(2, 3))
    groups = seq._module_groups
    assert [type(g).__name__ for g in groups] == [
        "OperationFuser", "Identity", "Identity", "OperationFuser", "Identity", "OperationFuser"]
    assert [g._num_basic_ops for g in groups if isinstance(g, OperationFuser)] == [2, 1, 3]
    # Fusers are not submodules: the module tree holds only the user's modules.
    assert len(list(seq.children())) == 9


def test_sequential_list_api_drops_cached_groups():
    seq = te.ops.Sequential(te.ops.ConstantScale(2.0))
    x = torch.ones(2, 3)
    assert torch.equal(seq(x), 2 * x)
    seq.append(te.ops.ConstantScale(3.0))
    assert torch.equal(seq(x), 6 * x)
    seq.insert(0, torch.nn.ReLU())
    assert torch.equal(seq(-x), torch.zeros(2, 3))
    del seq[0]
    assert torch.equal(seq(x), 6 * x)
    assert isinstance(seq[0:1], te.ops.Sequential) and len(seq[0:1]) == 1
    seq[1] = te.ops.ConstantScale(5.0)
    assert torch.equal(seq(x), 10 * x)
    assert isinstance(seq.pop(), te.ops.ConstantScale) and len(seq) == 1
    seq2 = seq + te.ops.Sequential(te.ops.ConstantScale(0.5))
    assert torch.equal(seq2(x), x)


def test_single_op_call_goes_through_a_one_op_fuser():
    op = te.ops.GELU()
    x = leaf(4, 6)
    y = op(x)
    y.sum().backward()
    assert isinstance(op.__dict__["_single_op_fuser"], OperationFuser)
    torch.testing.assert_close(y, ref.gelu(x.detach()), **FP32)
    assert y.grad_fn is not None and x.grad is not None
    assert op._extra_tensor_channels_locked


def test_fused_op_called_alone():
    bias, act = te.ops.Bias(6), te.ops.GELU()
    fused = BackwardActivationBias(bias=bias, activation=act)
    x = leaf(3, 6)
    with torch.no_grad():
        bias.bias.uniform_(-1, 1)
    fused(x).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    b2 = bias.bias.detach().clone().requires_grad_()
    ref.gelu(x2 + b2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **FP32)
    torch.testing.assert_close(bias.bias.grad, b2.grad, **FP32)


# ---- extra inputs and outputs -------------------------------------------------------------------


def test_public_extra_input_and_output():
    seq = te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.ConstantScale(2.0),
                            te.ops.AddExtraInput())
    x, r = leaf(3, 5, seed=1), leaf(3, 5, seed=2)
    y, e = seq(x, r)
    torch.testing.assert_close(y, 2 * x + r)
    assert e is x or torch.equal(e, x)
    (y.sum() + (3 * e).sum()).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0 + 3.0))
    torch.testing.assert_close(r.grad, torch.ones_like(r))


def test_unused_extra_output_grad_counts_as_zero():
    seq = te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.ConstantScale(2.0))
    x = leaf(3, 5)
    y, _ = seq(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_named_channel_residual_is_internal():
    make_out = te.ops.MakeExtraOutput().set_extra_output_channel(0, "res", output_to_caller=False)
    add_in = te.ops.AddExtraInput().set_extra_input_channel(0, "res")
    seq = te.ops.Sequential(make_out, te.ops.GELU(), add_in)
    x = leaf(4, 7)
    y = seq(x)
    assert isinstance(y, torch.Tensor)  # nothing public besides the output
    y.backward(torch.ones_like(y))
    x2 = x.detach().clone().requires_grad_()
    (ref.gelu(x2) + x2).sum().backward()
    torch.testing.assert_close(y, ref.gelu(x.detach()) + x.detach(), **FP32)
    torch.testing.assert_close(x.grad, x2.grad, **FP32)


def test_named_channel_also_public_sums_both_grads():
    make_out = te.ops.MakeExtraOutput().set_extra_output_channel(0, "res")
    add_in = te.ops.AddExtraInput().set_extra_input_channel(0, "res")
    seq = te.ops.Sequential(make_out, te.ops.ConstantScale(3.0), add_in)
    x = leaf(2, 5)
    y, e = seq(x)
    (y.sum() + (5 * e).sum()).backward()
    # y = 3x + x; e = x  ->  dx = 3 + 1 + 5
    torch.testing.assert_close(x.grad, torch.full_like(x, 9.0))


def test_channel_fan_out_to_two_consumers():
    seq = te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "a", output_to_caller=False),
        te.ops.ConstantScale(2.0),
        te.ops.AddExtraInput().set_extra_input_channel(0, "a"),
        te.ops.ConstantScale(3.0),
        te.ops.AddExtraInput().set_extra_input_channel(0, "a"),
    )
    x = leaf(3, 4)
    y = seq(x)
    torch.testing.assert_close(y, (2 * x + x) * 3 + x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 10.0))


def test_same_tensor_as_input_and_extra_input_is_deduplicated():
    seq = te.ops.Sequential(te.ops.ConstantScale(2.0), te.ops.AddExtraInput())
    x = leaf(3, 4)
    y = seq(x, x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_shared_parameter_grads_accumulate():
    bias = te.ops.Bias(5)
    with torch.no_grad():
        bias.bias.copy_(torch.linspace(-1, 1, 5))
    seq = te.ops.Sequential(bias, te.ops.GELU(), bias)
    x = leaf(3, 5)
    y = seq(x)
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    b2 = bias.bias.detach().clone().requires_grad_()
    (ref.gelu(x2 + b2) + b2).sum().backward()
    torch.testing.assert_close(y, (ref.gelu(x2 + b2) + b2).detach(), **FP32)
    torch.testing.assert_close(bias.bias.grad, b2.grad, **FP32)
    torch.testing.assert_close(x.grad, x2.grad, **FP32)


def test_channel_errors():
    with pytest.raises(IndexError, match="out of range"):
        te.ops.AddExtraInput().set_extra_input_channel(1, "a")
    with pytest.raises(IndexError, match="out of range"):
        te.ops.GELU().set_extra_output_channel(0, "a")
    with pytest.raises(ValueError, match="non-empty string"):
        te.ops.AddExtraInput().set_extra_input_channel(0, "")
    with pytest.raises(ValueError, match="non-empty string"):
        te.ops.MakeExtraOutput().set_extra_output_channel(0, 3)
    with pytest.raises(TypeError, match="output_to_caller must be a bool"):
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "a", output_to_caller=1)
    # Sequential resolves (and locks) the routing when it is built, as TransformerEngine documents.
    two = [te.ops.MakeExtraOutput().set_extra_output_channel(0, "a") for _ in range(2)]
    with pytest.raises(ValueError, match="multiple producers"):
        te.ops.Sequential(*two)
    with pytest.raises(ValueError, match="has no producer"):
        te.ops.Sequential(te.ops.AddExtraInput().set_extra_input_channel(0, "zz"))
    with pytest.raises(ValueError, match="no earlier producer"):
        te.ops.Sequential(te.ops.AddExtraInput().set_extra_input_channel(0, "b"),
                          te.ops.MakeExtraOutput().set_extra_output_channel(0, "b"))
    op = te.ops.MakeExtraOutput()
    op(torch.ones(2, 2))  # a single op locks on its first call
    with pytest.raises(RuntimeError, match="already captured its channel routing"):
        op.set_extra_output_channel(0, "c")
    member = te.ops.AddExtraInput()
    te.ops.Sequential(member)
    with pytest.raises(RuntimeError, match="already captured its channel routing"):
        member.set_extra_input_channel(0, "c")


def test_channel_unbind_restores_public_output():
    op = te.ops.MakeExtraOutput().set_extra_output_channel(0, "a", output_to_caller=False)
    op.set_extra_output_channel(0, None)
    assert op._extra_output_to_caller == [True]
    y, e = te.ops.Sequential(op)(torch.ones(2, 2))
    assert torch.equal(e, torch.ones(2, 2))


def test_extra_input_count_errors():
    seq = te.ops.Sequential(te.ops.AddExtraInput())
    with pytest.raises(ValueError, match="needs 1 extra inputs, only 0"):
        seq(torch.ones(2, 2))
    with pytest.raises(ValueError, match="1 extra input\\(s\\) were not consumed"):
        seq(torch.ones(2, 2), torch.ones(2, 2), torch.ones(2, 2))
    fuser = OperationFuser([te.ops.AddExtraInput()])
    with pytest.raises(ValueError, match="expected 1 extra inputs, got 0"):
        fuser(torch.ones(2, 2))


def test_extra_inputs_split_across_fusers_in_order():
    seq = te.ops.Sequential(te.ops.AddExtraInput(), torch.nn.Identity(),
                            te.ops.ConstantScale(2.0), te.ops.AddExtraInput())
    x, a, b = torch.ones(2, 2), torch.full((2, 2), 10.0), torch.full((2, 2), 100.0)
    torch.testing.assert_close(seq(x, a, b), (x + a) * 2 + b)


# ---- op_kwargs ----------------------------------------------------------------------------------


class ShiftOp(te.ops.BasicOperation):
    """A user-defined op taking a per-call kwarg: y = x + shift."""

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None,
                   next_op_input_quantizer=None, shift=None):
        return input_ if shift is None else input_ + shift

    def op_backward(self, ctx, grad_output):
        return grad_output, ()


def test_op_kwargs_by_module_and_index():
    a, b = ShiftOp(), ShiftOp()
    seq = te.ops.Sequential(a, te.ops.ConstantScale(2.0), b)
    x = torch.zeros(2, 3)
    out = seq(x, op_kwargs={a: {"shift": torch.ones(2, 3)}, 2: {"shift": torch.full((2, 3), 5.0)}})
    torch.testing.assert_close(out, torch.full((2, 3), 7.0))
    torch.testing.assert_close(seq(x), x)


def test_op_kwargs_errors():
    a = ShiftOp()
    seq = te.ops.Sequential(a, te.ops.Sequential(te.ops.GELU()))
    with pytest.raises(ValueError, match="not in this Sequential"):
        seq(torch.zeros(2, 3), op_kwargs={ShiftOp(): {"shift": 1.0}})
    fused = BackwardActivationBias(bias=te.ops.Bias(3), activation=te.ops.GELU())
    seq2 = te.ops.Sequential(fused)
    with pytest.raises(ValueError, match="must be basic operations"):
        seq2(torch.zeros(2, 3), op_kwargs={fused: {}})
    with pytest.raises(ValueError, match="out of range"):
        seq(torch.zeros(2, 3), op_kwargs={7: {}})
    with pytest.raises(ValueError, match="Bias takes no forward kwargs"):
        te.ops.Sequential(te.ops.Bias(3))(torch.zeros(2, 3), op_kwargs={0: {"bad": 1}})


# ---- plan caching and rebuild -------------------------------------------------------------------


def _count_builds(monkeypatch):
    calls = []
    original = OperationFuser._build_plan

    def counting(self, recipe, first):
        calls.append(first)
        return original(self, recipe, first)

    monkeypatch.setattr(OperationFuser, "_build_plan", counting)
    return calls


def test_plan_is_cached_and_chosen_by_config(monkeypatch, fusion_registry):
    calls = _count_builds(monkeypatch)
    bias = te.ops.Bias(4)
    seq = te.ops.Sequential(te.ops.ConstantScale(2.0), bias, te.ops.GELU())
    # the unquantized plans for every "first op needing backward" are built with the fuser
    assert calls == [0, 1, 2, 3]
    fuser = seq._module_groups[0]
    x = torch.randn(3, 4, requires_grad=True)
    for _ in range(3):
        seq(x).sum().backward()
    assert fuser.first_op_requiring_backward == 0
    seq(x.detach())  # input needs no grad: the first op needing backward is the Bias
    assert fuser.first_op_requiring_backward == 1
    with torch.no_grad():
        seq(x)
    assert fuser.first_op_requiring_backward == 3
    bias.bias.requires_grad_(False)
    seq(x.detach())  # nothing needs a gradient
    assert fuser.first_op_requiring_backward == 3
    bias.bias.requires_grad_(True)
    seq(x).sum().backward()
    assert fuser.first_op_requiring_backward == 0
    assert calls == [0, 1, 2, 3], "calls must never re-fuse for a known configuration"
    assert fuser._forward_ops is fuser.fusion_plan(x).forward_ops
    # a new fusion registration makes the next call re-plan its configuration
    te.ops.register_forward_fusion(lambda ops, *, recipe=None: ops)
    seq(x)
    assert calls == [0, 1, 2, 3, 0]
    seq(x)
    assert calls == [0, 1, 2, 3, 0]


def test_no_grad_output_does_not_require_grad():
    seq = te.ops.Sequential(te.ops.Bias(4), te.ops.GELU())
    with torch.no_grad():
        y = seq(torch.randn(2, 4, requires_grad=True))
    assert not y.requires_grad
    y = seq(torch.randn(2, 4))  # only the bias needs a grad
    assert y.requires_grad
    y.sum().backward()
    assert seq[0].bias.grad is not None


def test_backward_stops_before_ops_needing_no_grad():
    scale = te.ops.ConstantScale(2.0)
    bias = te.ops.Bias(4)
    seq = te.ops.Sequential(scale, bias)
    seq(torch.randn(2, 4)).sum().backward()
    fuser = seq._module_groups[0]
    assert fuser.first_op_requiring_backward == 1
    torch.testing.assert_close(bias.bias.grad, torch.full((4,), 2.0))


def test_frozen_bias_falls_back_inside_fused_backward():
    bias = te.ops.Bias(4)
    bias.bias.requires_grad_(False)
    seq = te.ops.Sequential(bias, te.ops.GELU())
    x = leaf(3, 4)
    seq(x).sum().backward()
    assert bias.bias.grad is None
    assert any(isinstance(op, BackwardActivationBias) for op, _ in seq._module_groups[0]._backward_ops)
    x2 = x.detach().clone().requires_grad_()
    ref.gelu(x2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **FP32)


def test_double_backward_is_refused():
    seq = te.ops.Sequential(te.ops.GELU())
    x = leaf(2, 3)
    v = torch.ones(2, 3, requires_grad=True)  # a grad_output that is itself differentiated
    (g,) = torch.autograd.grad(seq(x), x, grad_outputs=v, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        g.sum().backward()


# ---- fusion registration ------------------------------------------------------------------------


def test_backward_activation_bias_plan():
    for act_cls in (te.ops.GELU, te.ops.ReLU):
        seq = te.ops.Sequential(te.ops.ConstantScale(1.5), te.ops.Bias(6), act_cls())
        seq(torch.randn(2, 6, requires_grad=True)).sum().backward()
        fuser = seq._module_groups[0]
        assert [type(op) for op, _ in fuser._forward_ops] == [te.ops.ConstantScale,
                                                                ForwardBiasActivation]
        assert [idxs for _, idxs in fuser._forward_ops] == [(0,), (1, 2)]
        assert [type(op) for op, _ in fuser._backward_ops] == [te.ops.ConstantScale,
                                                                 BackwardActivationBias]
        assert [idxs for _, idxs in fuser._backward_ops] == [(0,), (1, 2)]
    # not adjacent: no fusion
    seq = te.ops.Sequential(te.ops.Bias(6), te.ops.Identity(), te.ops.GELU())
    seq(torch.randn(2, 6, requires_grad=True))
    assert not any(op.is_fused_op for op, _ in seq._module_groups[0]._backward_ops)


class ScaleTwice(te.ops.FusedOperation):
    """A user-defined forward-only fusion of two ConstantScales."""

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        s = self.basic_ops[0].scale * self.basic_ops[1].scale
        return torch.ops.te_cpp.constant_scale_fwd(input_, s), [(), ()]


_fuse_scale_pairs = pair_fusion(te.ops.ConstantScale, te.ops.ConstantScale, ScaleTwice)


def test_user_forward_fusion_and_existing_fuser_picks_it_up(fusion_registry):
    seq = te.ops.Sequential(te.ops.ConstantScale(2.0), te.ops.ConstantScale(3.0))
    x = leaf(2, 3)
    seq(x)
    assert not any(op.is_fused_op for op, _ in seq._module_groups[0]._forward_ops)
    te.ops.register_forward_fusion(_fuse_scale_pairs)
    y = seq(x)
    fuser = seq._module_groups[0]
    assert [type(op) for op, _ in fuser._forward_ops] == [ScaleTwice]
    assert [type(op) for op, _ in fuser._backward_ops] == [te.ops.ConstantScale] * 2
    y.sum().backward()
    torch.testing.assert_close(y, 6 * x)
    torch.testing.assert_close(x.grad, torch.full_like(x, 6.0))


def test_prepend_puts_a_fusion_first(fusion_registry):
    seen = []

    def spy(ops, *, recipe=None):
        seen.append([type(op).__name__ for op in ops])
        return ops

    te.ops.register_backward_fusion(spy)
    te.ops.register_backward_fusion(spy, prepend=True)
    te.ops.Sequential(te.ops.Bias(3), te.ops.GELU())(torch.randn(2, 3, requires_grad=True))
    # one plan per "first op needing backward" (0, 1, 2): both spies see the basic ops, as
    # TransformerEngine shows them without a recipe (BackwardActivationBias without a recipe
    # is our extension, applied after every registered fusion)
    assert seen == [["Bias", "GELU"], ["Bias", "GELU"]] * 3
    seen.clear()
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        te.ops.Sequential(te.ops.Bias(16), te.ops.GELU())(torch.randn(16, 16, requires_grad=True))
    # under a recipe TransformerEngine fuses them before the appended spy (the construction's
    # unquantized plans come first)
    assert seen[-2:] == [["Bias", "GELU"], ["BackwardActivationBias"]]
    assert OperationFuser.backward_fusion_functions[0] is spy
    with pytest.raises(TypeError, match="must be callable"):
        te.ops.register_forward_fusion(3)


class JointScale(te.ops.FusedOperation):
    """A user-defined joint (forward and backward) fusion of ConstantScale + GELU."""

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        s = self.basic_ops[0].scale
        h = torch.ops.te_cpp.constant_scale_fwd(input_, s)
        basic_op_ctxs[1].save_for_backward(h)
        return torch.ops.te_cpp.gelu_fwd(h), [(), ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (h,) = basic_op_ctxs[1].saved_tensors
        dh = torch.ops.te_cpp.gelu_bwd(grad_output, h)
        return torch.ops.te_cpp.constant_scale_bwd(dh, self.basic_ops[0].scale), [(), ()], [(), ()]


_fuse_joint = pair_fusion(te.ops.ConstantScale, te.ops.GELU, JointScale)


def test_user_joint_fusion_eager_and_compiled(fusion_registry):
    te.ops.register_forward_backward_fusion(_fuse_joint)
    seq = te.ops.Sequential(te.ops.ConstantScale(0.5), te.ops.GELU())
    x = leaf(3, 5)
    y = seq(x)
    fuser = seq._module_groups[0]
    assert [type(op) for op, _ in fuser._forward_ops] == [JointScale]
    assert [type(op) for op, _ in fuser._backward_ops] == [JointScale]
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref.gelu(0.5 * x2).sum().backward()
    torch.testing.assert_close(y, ref.gelu(0.5 * x.detach()), **FP32)
    torch.testing.assert_close(x.grad, x2.grad, **FP32)
    xc = x.detach().clone().requires_grad_()
    yc = torch.compile(seq, fullgraph=True, backend="aot_eager")(xc)
    yc.sum().backward()
    torch.testing.assert_close(yc, y, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, x.grad, rtol=0, atol=0)


def test_plan_consistency_check(fusion_registry):
    def drop_one(ops, *, recipe=None):
        return ops[1:]

    te.ops.register_forward_fusion(drop_one)
    with pytest.raises(RuntimeError, match="Found mismatch after fusing operations"):
        te.ops.Sequential(te.ops.GELU(), te.ops.ReLU())(torch.randn(2, 2))


def test_empty_fused_operation_is_rejected():
    with pytest.raises(ValueError, match="empty list"):
        ScaleTwice([])


@pytest.mark.parametrize("make", [
    lambda: te.ops.Bias(3), lambda: te.ops.GELU(), lambda: te.ops.SwiGLU(),
    lambda: te.ops.LayerNorm(3), lambda: te.ops.BasicLinear(3, 3), lambda: te.ops.Identity(),
    lambda: te.ops.ScaledSwiGLU(), lambda: te.ops.AddExtraInput(), lambda: te.ops.Dropout(0.1),
], ids=lambda f: "op")
def test_builtin_ops_reject_forward_kwargs(make):
    op = make()
    seq = te.ops.Sequential(op)
    with pytest.raises(ValueError, match=f"{type(op).__name__} takes no forward kwargs, "
                                         r"got \['bogus'\]"):
        seq(torch.zeros(2, 4), *[torch.zeros(2, 4)] * seq._module_groups[0].num_extra_inputs,
            op_kwargs={op: {"bogus": 1}})


def test_fusion_plan_is_the_plan_a_call_runs():
    """Sequential.fusion_plan returns, per fuser, the plan a call with that input runs: the
    same object the call then uses, by grad mode, input requires_grad and recipe; its repr
    names the fused groups."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(16), te.ops.Linear(16, 32), te.ops.GELU(),
                              torch.nn.Tanh(), te.ops.Linear(32, 16))
    x = torch.randn(4, 16)
    plans = model.fusion_plan(x, requires_grad=True)
    assert len(plans) == 2
    first, second = plans
    assert first.first_op_requiring_backward == 0
    assert [type(op).__name__ for op, _ in first.forward_ops] == [
        "LayerNorm", "ForwardLinearBiasActivation"]
    assert [idxs for _, idxs in first.forward_ops] == [(0,), (1, 2, 3)]
    assert "ForwardLinearBiasActivation(BasicLinear, Bias, GELU)" in repr(first)
    model(x.requires_grad_(True)).sum().backward()
    fusers = [g for g in model._module_groups if isinstance(g, OperationFuser)]
    assert fusers[0]._forward_ops is first.forward_ops
    assert fusers[1]._backward_ops is second.backward_ops
    # an input without grad: the first op the backward reaches is the LayerNorm (its weight)
    assert model.fusion_plan(x.detach())[0].first_op_requiring_backward == 0
    for p in model[0].parameters():
        p.requires_grad_(False)
    assert model.fusion_plan(x.detach())[0].first_op_requiring_backward == 1
    with torch.no_grad():
        no_grad = model.fusion_plan(x)
    assert [p.first_op_requiring_backward for p in no_grad] == [4, 2]
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        quantized = model.fusion_plan(x, requires_grad=True)
    assert quantized[0].recipe_type is te.recipe.Float8CurrentScaling
    assert first.recipe_type is type(None)
    with pytest.raises(ValueError, match="expected 0 extra inputs, got 1"):
        fusers[0].fusion_plan(x, x)


def test_one_pipeline_function_runs_every_configuration():
    """Every configuration runs through the one pipeline Function: plain, extra tensors, op
    kwargs, a recipe; no other autograd.Function is defined in the ops package."""
    from transformer_engine_cpp.ops._pipeline import PipelineFunction

    functions = [c for c in torch.autograd.Function.__subclasses__()
                 if c.__module__.startswith("transformer_engine_cpp.ops")]
    assert functions == [PipelineFunction]

    class _Kw(te.ops.Identity):
        accepts_forward_kwargs = True

        def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None,
                       next_op_input_quantizer=None, factor=1.0):
            return input_ * factor

    x = torch.randn(32, 32, requires_grad=True)
    plain = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU())
    extra = te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.Linear(32, 32),
                              te.ops.AddExtraInput())
    kw_op = _Kw()
    kw = te.ops.Sequential(kw_op, te.ops.Linear(32, 32))
    outs = [plain(x), extra(x, torch.randn(32, 32))[0], kw(x, op_kwargs={kw_op: {"factor": 2.0}})]
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        outs.append(plain(x))
    assert [type(y.grad_fn).__name__ for y in outs] == ["PipelineFunctionBackward"] * 4


# ---- op contexts --------------------------------------------------------------------------------

# The basic ops with nothing but saved tensors (or nothing) between their passes.
_PLAIN_CONTEXT_OPS = {"AddExtraInput", "AllGather", "AllReduce", "ConstantScale", "Identity",
                      "L2Normalization", "MakeExtraOutput", "ReduceScatter"}


@pytest.mark.parametrize("name", te.ops.basic.__all__)
def test_basic_op_context_is_typed_with_class_level_defaults(name):
    """Every other basic op declares a dataclass context whose fields all have plain immutable
    defaults, which are class attributes: the pipeline creates eager contexts without
    ``__init__`` (``object.__new__``), so each field a backward reads exists whichever forward,
    fused or not, filled the context."""
    from transformer_engine_cpp.ops.op import OperationContext

    context_type = getattr(te.ops.basic, name).context_type
    assert issubclass(context_type, OperationContext) and dataclasses.is_dataclass(context_type)
    if name in _PLAIN_CONTEXT_OPS:
        assert context_type is OperationContext
        return
    assert context_type is not OperationContext
    ctx = object.__new__(context_type)
    for field in dataclasses.fields(context_type):
        assert field.default is not dataclasses.MISSING, field.name
        assert field.default_factory is dataclasses.MISSING, field.name
        hash(field.default)  # immutable: shared by every context
        assert getattr(ctx, field.name) is field.default, field.name
