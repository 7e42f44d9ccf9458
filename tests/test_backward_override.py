"""Recipes' ``backward_override`` (TransformerEngine's): the forward is quantized as without it,
the backward GEMMs are not. "high_precision" saves the original input and weight;
"dequantized" saves the quantized buffers and multiplies their dequantized values. No op hands
a gradient back quantized; the plan is cached per override."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_cpp as te
from test_fp8_ops import fq_current, fq_mx_rows
from test_fp8_quantize import E4M3
from tolerances import COMPILED_VS_EAGER, tols

RECIPES = {
    "current": (lambda **kw: te.recipe.Float8CurrentScaling(**kw), fq_current),
    "mxfp8": (lambda **kw: te.recipe.MXFP8BlockScaling(**kw), fq_mx_rows),
}
OVERRIDES = ["high_precision", "dequantized"]
FP32 = tols(torch.float32)


def _saved_dtypes(fn):
    """The dtypes of the tensors autograd saves while ``fn`` runs."""
    dtypes = []

    def pack(t):
        dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, dtypes


@pytest.mark.parametrize("override", OVERRIDES)
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_linear_backward_is_unquantized(recipe_name, override):
    make, fq = RECIPES[recipe_name]
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 32), te.ops.GELU(), te.ops.Linear(32, 32))
    x = torch.randn(64, 64, requires_grad=True)
    dy = torch.randn(64, 32)

    def step(recipe):
        x.grad = None
        for p in model.parameters():
            p.grad = None
        with te.autocast(recipe=recipe):
            y = model(x)
        y.backward(dy)
        return y.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]

    y_plain, _, _ = step(make())
    (y, dx, grads), dtypes = _saved_dtypes(lambda: step(make(backward_override=override)))
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)  # the same quantized forward
    if override == "high_precision":
        assert torch.uint8 not in dtypes
    else:
        assert torch.uint8 in dtypes
    # the float64 reference: the forward's operands (original or dequantized), dy unquantized
    w1, b1, w2, b2 = [p.detach().double() for p in model.parameters()]
    xd = x.detach().double()
    keep = (lambda t: t) if override == "high_precision" else (lambda t: fq(t.float(), E4M3))
    h = fq(x.detach(), E4M3) @ fq(model[0].weight.detach(), E4M3).t() + b1
    h = h.float().double()
    a = torch.nn.functional.gelu(h, approximate="tanh")
    da = dy.double() @ keep(w2)
    # GELU hands fc2 its output quantized (the forward neighbour protocol stays on): fc2's
    # "original" input is that quantized tensor in both modes, as in TransformerEngine
    dw2 = dy.double().t() @ fq(a.float(), E4M3)
    dh = da * torch.autograd.functional.vjp(
        lambda t: torch.nn.functional.gelu(t, approximate="tanh"), h, torch.ones_like(h))[1]
    dw1 = dh.t() @ keep(xd)
    dx_ref = dh @ keep(w1)
    torch.testing.assert_close(grads[2].double(), dw2, **FP32)
    torch.testing.assert_close(grads[0].double(), dw1, **FP32)
    torch.testing.assert_close(dx.double(), dx_ref, **FP32)
    torch.testing.assert_close(grads[1].double(), dh.sum(0), **FP32)


def test_quantize_op_leaves_the_gradient_alone_under_an_override():
    model = te.ops.Sequential(te.ops.Quantize(forward=False, backward=True))
    x = torch.randn(8, 32, requires_grad=True)
    dy = torch.randn(8, 32)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        model(x).backward(dy)
    assert not torch.equal(x.grad, dy)  # quantized without an override
    x.grad = None
    with te.autocast(recipe=te.recipe.Float8CurrentScaling(backward_override="dequantized")):
        model(x).backward(dy)
    assert torch.equal(x.grad, dy)


def test_the_plan_depends_on_the_override():
    model = te.ops.Sequential(te.ops.Quantize(forward=False, backward=True),
                              te.ops.Bias(32), te.ops.GELU())
    x = torch.randn(8, 32, requires_grad=True)

    def backward_plan(recipe):
        with te.autocast(recipe=recipe):
            plan, = model.fusion_plan(x, requires_grad=True)
        return [type(op).__name__ for op, _ in plan.backward_ops]

    assert backward_plan(te.recipe.Float8CurrentScaling()) == ["Quantize",
                                                               "BackwardActivationBias"]
    assert backward_plan(te.recipe.Float8CurrentScaling(
        backward_override="high_precision")) == ["Quantize", "Bias", "GELU"]


@pytest.mark.parametrize("override", OVERRIDES)
def test_grouped_linear_backward_is_unquantized(override):
    recipe = te.recipe.Float8CurrentScaling(backward_override=override)
    splits = [5, 0, 11]
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(3, 32, 16)
    x = torch.randn(16, 32, requires_grad=True)
    dy = torch.randn(16, 16)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor(splits))
    y.backward(dy)
    keep = ((lambda t: t.double()) if override == "high_precision"
            else (lambda t: fq_current(t, E4M3)))
    r = 0
    for g, n in enumerate(splits):
        w = op.weights()[g].detach()
        xs, dys = x.detach()[r:r + n], dy[r:r + n]
        torch.testing.assert_close(x.grad[r:r + n].double(), dys.double() @ keep(w), **FP32)
        ref_dw = dys.double().t() @ (keep(xs) if n else xs.double())
        torch.testing.assert_close(op.weights()[g].grad.double(), ref_dw, **FP32)
        r += n


@pytest.mark.parametrize("override", OVERRIDES)
def test_compiled_equals_eager_under_an_override(override):
    recipe = te.recipe.Float8CurrentScaling(backward_override=override)

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(64, 64), te.ops.ReLU(), te.ops.Linear(64, 32))

    eager, comp = make(), make()
    compiled = torch.compile(comp, backend="aot_eager", fullgraph=True)
    results = []
    for model in (eager, compiled):
        torch.manual_seed(1)
        x = torch.randn(32, 64, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = model(x)
        y.backward(torch.randn(32, 32))
        results.append([y.detach(), x.grad, *[p.grad for p in model.parameters()]])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)


@pytest.mark.parametrize("override", OVERRIDES)
@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8BlockScaling, te.recipe.NVFP4BlockScaling],
                         ids=["block", "nvfp4"])
def test_block_scaled_recipes_take_the_override(recipe_cls, override):
    """Float8BlockScaling and NVFP4BlockScaling: the forward as without the override, the
    backward GEMMs on the original operands or on the forward's dequantized ones (as the op's
    own quantizers make them)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.BasicLinear(128, 64))
    x = torch.randn(128, 128, requires_grad=True)
    dy = torch.randn(128, 64)
    with te.autocast(recipe=recipe_cls()):
        y_plain = model(x).detach()
    with te.autocast(recipe=recipe_cls(backward_override=override)):
        y = model(x)
    y.backward(dy)
    torch.testing.assert_close(y.detach(), y_plain, rtol=0, atol=0)
    op = model[0]
    w = op.weight.detach()
    if override == "high_precision":
        xr, wr = x.detach().double(), w.double()
    else:
        xr = op.get_quantizer("forward", 0).quantize_storage(x.detach()).dequantize_rowwise(
            torch.float64)
        wr = op.get_quantizer("forward", 1).quantize_storage(w).dequantize_rowwise(
            torch.float64)
    torch.testing.assert_close(x.grad.double(), dy.double() @ wr, **FP32)
    torch.testing.assert_close(op.weight.grad.double(), dy.double().t() @ xr, **FP32)
