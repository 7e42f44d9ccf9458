"""Regression tests of the fuser's correctness (issue 11): in-place residuals, channel forks,
saved-tensor release with None slots, bias-only training, duplicate outputs under compile,
Sequential's keys, extra outputs' requires_grad, Bias' backward after a user forward fusion,
and the order in which user fusions see the ops. Each failed before its fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import transformer_engine_cpp as te
from transformer_engine_cpp.ops.op import BasicOperation
from transformer_engine_cpp.testing import reference as ref

from harness import pair_fusion
from tolerances import tols

FP32 = tols(torch.float32)


def _leaf(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_()


def _residual(*middle, make_in_place=True, add_in_place=True):
    fork = te.ops.MakeExtraOutput(in_place=make_in_place).set_extra_output_channel(
        0, "res", output_to_caller=False)
    join = te.ops.AddExtraInput(in_place=add_in_place).set_extra_input_channel(0, "res")
    return te.ops.Sequential(fork, *middle, join)


# ---- 1. in-place residuals around ops that save their input ---------------------------------

def test_in_place_residual_around_layernorm_gives_the_reference_grads():
    m = _residual(te.ops.LayerNorm(8))
    x, dy = _leaf(3, 8), torch.randn(3, 8)
    x64 = x.detach().double().requires_grad_()
    (F.layer_norm(x64, (8,)) + x64).backward(dy.double())
    y = m(x)
    y.backward(dy)
    torch.testing.assert_close(x.grad.double(), x64.grad, **FP32)


def _prenorm_mlp_grads(in_place, x, dy, recipe=None, ffn=128):
    torch.manual_seed(0)
    block = ref.te_prenorm_mlp(x.shape[-1], ffn, in_place=in_place)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
    x = x.detach().clone().requires_grad_()
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = block(x)
    y.backward(dy)
    return y.detach(), x.grad, [p.grad for p in block.parameters()]


@pytest.mark.parametrize("recipe", [None, te.recipe.Float8CurrentScaling()],
                         ids=["no_recipe", "current_scaling"])
@pytest.mark.parametrize("shape", [(256, 64, 128), (2048, 512, 1024), (4096, 1024, 1024)],
                         ids=["small", "large", "4096x1024"])
def test_in_place_prenorm_mlp_equals_the_functional_block(recipe, shape):
    """The pre-norm MLP block with in-place residual ops gives exactly the functional block's
    output and gradients (from 256x64 up: the saved tensors are released step by step). Under
    a recipe the in-place add fuses into the second linear's FP8 GEMM (TransformerEngine's
    ForwardLinearBiasAdd: the bias and the residual added in fp32 before one rounding) and the
    functional add does not (our extension is off under a recipe), so the two agree to fp32's
    rounding there."""
    rows, hidden, ffn = shape
    x, dy = _leaf(rows, hidden, seed=1), torch.randn(rows, hidden)
    y0, dx0, dp0 = _prenorm_mlp_grads(False, x, dy, recipe, ffn)
    y1, dx1, dp1 = _prenorm_mlp_grads(True, x, dy, recipe, ffn)
    tol = dict(rtol=0, atol=0) if recipe is None else tols(torch.float32)
    torch.testing.assert_close(y1, y0, **tol)
    torch.testing.assert_close(dx1, dx0, **tol)
    for a, b in zip(dp1, dp0):
        torch.testing.assert_close(a, b, **tol)


def test_in_place_prenorm_mlp_compiled_equals_eager():
    """The in-place pre-norm MLP block at 2048x512 compiled (functional in-place forms) gives
    the eager block's output and gradients exactly."""
    torch._dynamo.reset()
    x, dy = _leaf(2048, 512, seed=3), torch.randn(2048, 512)
    blocks = []
    for _ in range(2):
        torch.manual_seed(0)
        block = ref.te_prenorm_mlp(512, 1024, in_place=True)
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0, 0.05)
        blocks.append(block)
    xe, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ye = blocks[0](xe)
    ye.backward(dy)
    yc = torch.compile(blocks[1], fullgraph=True, backend="aot_eager")(xc)
    yc.backward(dy)
    torch.testing.assert_close(yc, ye, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=0, atol=0)
    for pc, pe in zip(blocks[1].parameters(), blocks[0].parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=0, atol=0)


def test_in_place_prenorm_mlp_matches_float64():
    x, dy = _leaf(16, 64, seed=2), torch.randn(16, 64)
    y, dx, dps = _prenorm_mlp_grads(True, x, dy)
    torch.manual_seed(0)
    ours = ref.te_prenorm_mlp(64, 128)  # the parameters _prenorm_mlp_grads drew
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.2)
    plain = ref.PreNormMLP(64, 128, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(plain.parameters(), ours.parameters()):
            p.copy_(q.double())
    x64 = x.detach().double().requires_grad_()
    y64 = plain(x64)
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64, **FP32)
    torch.testing.assert_close(dx.double(), x64.grad, **FP32)
    for g, p in zip(dps, plain.parameters()):
        torch.testing.assert_close(g.double(), p.grad, **FP32)


def test_in_place_add_still_writes_into_the_callers_buffer():
    """A public extra input of AddExtraInput(in_place=True) receives the sum (TransformerEngine's
    semantics), also when an op before it saved that buffer (the saved copy keeps the old
    values)."""
    e = torch.randn(3, 8)
    m = te.ops.Sequential(te.ops.MakeExtraOutput().set_extra_output_channel(
        0, "res", output_to_caller=False), te.ops.LayerNorm(8),
        te.ops.AddExtraInput(in_place=True).set_extra_input_channel(0, "res"),
        te.ops.AddExtraInput(in_place=True))
    x = _leaf(3, 8)
    x0, e0 = x.detach().clone(), e.clone()
    y = m(x, e)
    assert y.data_ptr() == e.data_ptr()
    h = F.layer_norm(x0, (8,)) + x0
    torch.testing.assert_close(e, h + e0)
    # the channel's join wrote into the pipeline input (MakeExtraOutput returns it), as
    # TransformerEngine does; the gradient is still the reference's
    torch.testing.assert_close(x.detach(), h)
    y.sum().backward()
    x64 = x0.double().requires_grad_()
    (F.layer_norm(x64, (8,)) + x64).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, **FP32)


@pytest.mark.parametrize("add_fuses", [False, True], ids=["add", "linear_add"])
def test_in_place_residual_under_reentrant_checkpoint_is_refused(add_fuses):
    """Inside torch.utils.checkpoint(use_reentrant=True) the forward writes its output into the
    checkpointed function's input (the residual's buffer), and the recompute in the backward
    reads it back: plain PyTorch's own in-place write there fails in the recompute (a leaf that
    requires grad), ours bypassed autograd and returned wrong gradients. During a backward pass
    an in-place write into a leaf that requires grad raises, naming the op; the functional
    residual still checkpoints to the un-checkpointed gradients."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    a, dy = torch.randn(4, 8), torch.randn(4, 8)
    middle = [te.ops.LayerNorm(8), te.ops.Linear(8, 8)]
    if not add_fuses:
        middle.append(te.ops.GELU())
    with pytest.raises(RuntimeError, match="in_place=True.*leaf.*use_reentrant"):
        checkpoint(_residual(*middle), a @ w, use_reentrant=True).backward(dy)
    m = _residual(*middle, make_in_place=False, add_in_place=False)
    grads = []
    for ckpt in (False, True):
        y = checkpoint(m, a @ w, use_reentrant=True) if ckpt else m(a @ w)
        y.backward(dy)
        grads.append([w.grad, *[p.grad for p in m.parameters()]])
        w.grad = None
        m.zero_grad(set_to_none=True)
    for g, r in zip(*grads, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.parametrize("reentrant, fp8", [(False, False), (True, False), (False, True)],
                         ids=["non_reentrant", "reentrant", "non_reentrant_current_scaling"])
def test_checkpoint_at_a_realistic_size_equals_the_plain_step(reentrant, fp8):
    """A 4096x1024 LayerNorm-Linear-GELU-Linear step through torch.utils.checkpoint equals the
    plain step bitwise, where the pipeline boxes its saved tensors for early release
    (RELEASE_MIN_NUMEL) inside the checkpoint's saved-tensor hooks (the values; not the memory
    the chaining saves); under current scaling with the context_fn of docs/quantization.md."""
    import contextlib

    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    m = te.ops.Sequential(te.ops.LayerNorm(1024), te.ops.Linear(1024, 1024), te.ops.GELU(),
                          te.ops.Linear(1024, 1024))
    x, dy = _leaf(4096, 1024), torch.randn(4096, 1024)
    recipe = te.recipe.Float8CurrentScaling() if fp8 else None
    kwargs = dict(context_fn=lambda: (contextlib.nullcontext(), te.autocast(recipe=recipe))
                  ) if fp8 else {}

    def step(ckpt):
        with te.autocast(enabled=fp8, recipe=recipe):
            y = checkpoint(m, x, use_reentrant=reentrant, **kwargs) if ckpt else m(x)
        y.backward(dy)
        grads = [y.detach(), x.grad, *[p.grad for p in m.parameters()]]
        x.grad = None
        m.zero_grad(set_to_none=True)
        return grads

    for got, expected in zip(step(True), step(False), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ---- 2. a channel fork with a public extra input in between ---------------------------------

@pytest.mark.parametrize("make_in_place", [False, True])
def test_fork_with_public_extra_input_gets_its_own_grad(make_in_place):
    fork = te.ops.MakeExtraOutput(in_place=make_in_place).set_extra_output_channel(
        0, "res", output_to_caller=False)
    m = te.ops.Sequential(fork, te.ops.ConstantScale(3.0), te.ops.AddExtraInput(),
                          te.ops.AddExtraInput().set_extra_input_channel(0, "res"))
    x, e = _leaf(3, 8), _leaf(3, 8, seed=1)
    dy = torch.ones(3, 8)
    m(x, e).backward(dy)
    assert torch.equal(e.grad, torch.ones(3, 8))
    assert torch.equal(x.grad, torch.full((3, 8), 4.0))
    assert torch.equal(dy, torch.ones(3, 8))  # the caller's gradient is never written


# ---- 6. saved-tensor release with None slots -------------------------------------------------

def _grads_with_and_without_release(make_seq, x_shape, x_requires_grad=True, recipe=None):
    out = []
    for retain in (False, True):  # retain_graph keeps every saved tensor (no release)
        torch.manual_seed(0)
        seq = make_seq()
        x = torch.randn(*x_shape, requires_grad=x_requires_grad)
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = seq(x)
        y.backward(torch.ones_like(y), retain_graph=retain)
        out.append([t.grad for t in [x, *seq.parameters()] if t.grad is not None])
    return out


@pytest.mark.parametrize("case", ["fp8_linear", "fp8_delayed_linear", "frozen_weight",
                                  "mxfp8_no_input_grad"])
def test_large_inputs_with_none_saved_slots_release_correctly(case):
    """At >= 64Ki input elements each step's saved tensors are released as its backward ran;
    contexts that save None (FP8 linears, frozen weights) must not shift the release."""
    if case == "fp8_linear":
        args = (lambda: te.ops.Sequential(te.ops.Linear(256, 256)), (256, 256), True,
                te.recipe.Float8CurrentScaling())
    elif case == "fp8_delayed_linear":
        args = (lambda: te.ops.Sequential(te.ops.Linear(256, 256)), (256, 256), True,
                te.recipe.DelayedScaling())
    elif case == "frozen_weight":
        def make():
            lin = te.ops.BasicLinear(256, 256)
            lin.weight.requires_grad_(False)
            return te.ops.Sequential(lin, te.ops.GELU(), te.ops.Linear(256, 256))
        args = (make, (256, 256), True, None)
    else:
        args = (lambda: te.ops.Sequential(te.ops.Linear(256, 256), te.ops.GELU(),
                                          te.ops.Linear(256, 256)),
                (256, 256), False, te.recipe.MXFP8BlockScaling())
    released, kept = _grads_with_and_without_release(*args)
    assert len(released) == len(kept) > 0
    for a, b in zip(released, kept):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- 7. bias-only fine-tuning ----------------------------------------------------------------

@pytest.mark.parametrize("x_requires_grad", [False, True])
def test_bias_only_training(x_requires_grad):
    lin = te.ops.Linear(8, 4)
    lin.weight.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=x_requires_grad)
    dy = torch.randn(3, 4)
    lin(x).backward(dy)
    torch.testing.assert_close(lin.bias.grad, dy.sum(0), **FP32)
    assert lin.weight.grad is None
    if x_requires_grad:
        torch.testing.assert_close(x.grad, dy @ lin.weight.detach(), **FP32)


# ---- 8. the same tensor returned twice, compiled ---------------------------------------------

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_make_extra_output_after_an_op(backend):
    torch._dynamo.reset()
    m = te.ops.Sequential(te.ops.ReLU(), te.ops.MakeExtraOutput())
    x = _leaf(3, 8)
    xc = x.detach().clone().requires_grad_()
    y, e = m(x)
    (2 * y + 3 * e).sum().backward()
    yc, ec = torch.compile(m, fullgraph=True, backend=backend)(xc)
    (2 * yc + 3 * ec).sum().backward()
    torch.testing.assert_close(yc, y, rtol=0, atol=0)
    torch.testing.assert_close(ec, e, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, x.grad, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, 5.0 * (x.detach() > 0).float())


# ---- 11. Sequential's keys -------------------------------------------------------------------

def test_append_and_extend_after_del_keep_every_module():
    s = te.ops.Sequential(te.ops.Identity(), te.ops.ReLU(), te.ops.GELU())
    del s[0]
    s.append(te.ops.SiLU())
    assert [type(m).__name__ for m in s] == ["ReLU", "GELU", "SiLU"]
    assert list(s._modules) == ["1", "2", "3"]
    s.extend([te.ops.QGELU(), te.ops.SReLU()])
    assert [type(m).__name__ for m in s] == ["ReLU", "GELU", "SiLU", "QGELU", "SReLU"]


def test_insert_keeps_named_keys():
    s = te.ops.Sequential({"norm": te.ops.LayerNorm(4), "act": te.ops.GELU()})
    s.insert(1, te.ops.Identity())
    assert [type(m).__name__ for m in s] == ["LayerNorm", "Identity", "GELU"]
    assert list(s._modules)[:2] == ["norm", "act"]
    y = s(torch.randn(2, 4))
    assert y.shape == (2, 4)


# ---- 12. fresh extra outputs on a channel need grad -------------------------------------------

class _Tap(BasicOperation):
    """y = x; extra output = 2 * x, a fresh tensor made inside the pipeline (it carries no
    requires_grad of its own)."""

    num_extra_outputs = 1

    def op_forward(self, *args, **kwargs):
        raise RuntimeError("fuser_forward only")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError("fuser_backward only")

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        return input_, [(2 * input_,)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        g = basic_op_grad_extra_outputs[0][0]
        return (grad_output if g is None else grad_output + 2 * g), [()], [()]


class _Sink(BasicOperation):
    """y = x * mean(e); dE only when the fuser says e needs a gradient."""

    num_extra_inputs = 1

    def op_forward(self, *args, **kwargs):
        raise RuntimeError("fuser_forward only")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError("fuser_backward only")

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs,
                      **unused):
        ctx = basic_op_ctxs[0]
        (e,) = basic_op_extra_inputs[0]
        ctx.e_requires_grad = ctx.extra_inputs_requires_grad[0]
        ctx.save_for_backward(input_, e)
        return input_ * e.mean(), [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        x, e = ctx.saved_tensors
        de = None
        if ctx.e_requires_grad:
            de = torch.full_like(e, (grad_output * x).sum().item() / e.numel())
        return grad_output * e.mean(), [()], [(de,)]


@pytest.mark.parametrize("x_requires_grad", [False, True])
def test_fresh_channel_extra_output_requires_grad(x_requires_grad):
    """A fresh extra output on a channel, made at or after the first op needing backward, is
    marked as needing a gradient for its consumer (TransformerEngine marks it requires_grad)."""
    torch.manual_seed(0)
    lin = te.ops.BasicLinear(6, 6)
    tap = _Tap().set_extra_output_channel(0, "t", output_to_caller=False)
    sink = _Sink().set_extra_input_channel(0, "t")
    m = te.ops.Sequential(lin, tap, sink)
    x = torch.randn(2, 6, requires_grad=x_requires_grad)
    m(x).sum().backward()
    w = lin.weight.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_(x_requires_grad)
    h = x2 @ w.t()
    (h * (2 * h).mean()).sum().backward()
    torch.testing.assert_close(lin.weight.grad, w.grad, **FP32)
    if x_requires_grad:
        torch.testing.assert_close(x.grad, x2.grad, **FP32)


# ---- 13. Bias' backward after a user forward fusion ------------------------------------------

class _UserBiasGELU(te.ops.FusedOperation):
    """A user's forward fusion of Bias and GELU that fills only what GELU's backward needs."""

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        z = input_ + self.basic_ops[0].bias
        basic_op_ctxs[1].save_for_backward(z)
        basic_op_ctxs[1].input_dtype = z.dtype
        return torch.ops.te_cpp.gelu_fwd(z), [(), ()]


def test_bias_backward_after_a_user_forward_fusion(fusion_registry):
    te.ops.register_forward_fusion(pair_fusion(te.ops.Bias, te.ops.GELU, _UserBiasGELU),
                                   prepend=True)
    torch.manual_seed(0)
    m = te.ops.Sequential(te.ops.Bias(8), te.ops.GELU())
    with torch.no_grad():
        m[0].bias.normal_()
    x = _leaf(3, 8)
    y = m(x)
    assert [type(op).__name__ for op, _ in m._module_groups[0]._forward_ops] == ["_UserBiasGELU"]
    y.sum().backward()
    b = m[0].bias.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    ref.gelu(x2 + b).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **FP32)
    torch.testing.assert_close(m[0].bias.grad, b.grad, **FP32)


# ---- 14. user fusions see the ops TransformerEngine would show them ---------------------------

def _seen_by(register, ops, dtype=torch.float32):
    seen = []

    def spy(ops, *, recipe=None):
        seen.append([type(op).__name__ for op in ops])
        return ops

    register(spy)
    m = te.ops.Sequential(*ops)
    m(torch.randn(2, 8, dtype=dtype, requires_grad=True)).sum().backward()
    return seen[-1]


def test_user_forward_fusion_sees_unfused_activation(fusion_registry):
    # fp32: TransformerEngine fuses no [BasicLinear, Bias] (fp16/bf16 only) and no activation
    assert _seen_by(te.ops.register_forward_fusion,
                    [te.ops.Linear(8, 8), te.ops.GELU(), te.ops.Bias(8), te.ops.ReLU()]) == \
        ["BasicLinear", "Bias", "GELU", "Bias", "ReLU"]
    # bf16: [BasicLinear, Bias] is TransformerEngine's ForwardLinearBiasActivation, the GELU after
    # it stays a separate op
    assert _seen_by(te.ops.register_forward_fusion,
                    [te.ops.Linear(8, 8, dtype=torch.bfloat16), te.ops.GELU()],
                    torch.bfloat16) == ["ForwardLinearBiasActivation", "GELU"]


def test_user_backward_fusion_sees_bias_and_activation(fusion_registry):
    # without a recipe TransformerEngine fuses none of these in backward
    assert _seen_by(te.ops.register_backward_fusion,
                    [te.ops.Linear(8, 8), te.ops.Bias(8), te.ops.GELU()]) == \
        ["BasicLinear", "Bias", "Bias", "GELU"]


def test_extensions_still_apply_after_user_fusions(fusion_registry):
    m = te.ops.Sequential(te.ops.Linear(8, 8, dtype=torch.bfloat16), te.ops.GELU(),
                          te.ops.Bias(8, dtype=torch.bfloat16), te.ops.ReLU())
    te.ops.register_forward_fusion(lambda ops, *, recipe=None: ops)
    m(torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    fuser = m._module_groups[0]
    assert [type(op).__name__ for op, _ in fuser._forward_ops] == \
        ["ForwardLinearBiasActivation", "ForwardBiasActivation"]
    assert fuser._forward_ops[0][0]._activation == "gelu"
    assert [type(op).__name__ for op, _ in fuser._backward_ops] == \
        ["BasicLinear", "BackwardActivationBias", "BackwardActivationBias"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_functional_residual_add_after_linear_fuses_in_every_dtype(dtype, fusion_registry):
    """[Linear, AddExtraInput()]: a user's forward fusion sees what TransformerEngine shows it
    ([BasicLinear, Bias] fused only for fp16/bf16 weights; the functional add unfused); the
    extensions then make one ForwardLinearBiasAdd in every dtype."""
    expected_seen = (["BasicLinear", "Bias", "AddExtraInput"] if dtype == torch.float32
                     else ["ForwardLinearBiasActivation", "AddExtraInput"])
    seen = []

    def spy(ops, *, recipe=None):
        seen.append([type(op).__name__ for op in ops])
        return ops

    te.ops.register_forward_fusion(spy)
    m = te.ops.Sequential(te.ops.Linear(8, 8, dtype=dtype), te.ops.AddExtraInput())
    x = torch.randn(2, 8, dtype=dtype, requires_grad=True)
    m(x, torch.randn(2, 8, dtype=dtype)).sum().backward()
    assert seen[-1] == expected_seen
    assert [type(op).__name__ for op, _ in m._module_groups[0]._forward_ops] == \
        ["ForwardLinearBiasAdd"]


class _PassGradToParam(BasicOperation):
    """y = x + p (p a scalar parameter): dx = dy and dp = dy.sum(), or, as a user op may,
    the very tensor dy when it has one element."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(()))

    def op_forward(self, ctx, input_, **kwargs):
        return input_ + self.p

    def op_backward(self, ctx, grad_output):
        return grad_output, (grad_output.reshape(()) if grad_output.numel() == 1
                             else grad_output.sum(),)


def test_in_place_grad_accumulation_never_writes_a_parameter_grad():
    """A grad that a user op returned as a parameter gradient is not writable for
    MakeExtraOutput(in_place=True), even when nothing else in the pipeline holds it."""
    fork = te.ops.MakeExtraOutput(in_place=True).set_extra_output_channel(
        0, "res", output_to_caller=False)
    m = te.ops.Sequential(fork, te.ops.ConstantScale(2.0),
                          te.ops.AddExtraInput().set_extra_input_channel(0, "res"),
                          _PassGradToParam(), te.ops.ConstantScale(1.0))
    x = _leaf(1, 1)
    m(x).backward(torch.full((1, 1), 5.0))
    assert m[3].p.grad.item() == 5.0
    assert x.grad.item() == 15.0


def test_in_place_grad_accumulation_never_writes_the_callers_grad_through_a_view():
    """A Reshape after the join hands the fork a view of the caller's dy as the residual's
    grad: it is not writable either."""
    fork = te.ops.MakeExtraOutput(in_place=True).set_extra_output_channel(
        0, "res", output_to_caller=False)
    m = te.ops.Sequential(fork, te.ops.ConstantScale(3.0),
                          te.ops.AddExtraInput().set_extra_input_channel(0, "res"),
                          te.ops.Reshape((8,)))
    x = _leaf(2, 4)
    dy = torch.ones(8)
    m(x).backward(dy)
    assert torch.equal(dy, torch.ones(8))
    assert torch.equal(x.grad, torch.full((2, 4), 4.0))
