"""TransformerEngine's forward linear fusions under a recipe (ForwardLinearBiasActivation,
ForwardLinearBiasAdd, ForwardLinearScaleAdd): in the plan as TransformerEngine applies them,
the FP8 GEMM's epilogue (bias, residual, scale) added in fp32 before one rounding, against a
float64 emulation; backward equal to the unfused ops' bit for bit; compiled equal to eager; our
extensions (activation epilogue, functional add) stay off under a recipe."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_cpp as te
from test_fp8_ops import fq_current, fq_mx_cols, fq_mx_rows
from test_fp8_quantize import E4M3, E5M2
from tolerances import COMPILED_VS_EAGER, tols

RECIPES = {
    "current": (te.recipe.Float8CurrentScaling, fq_current, fq_current),
    "mxfp8": (te.recipe.MXFP8BlockScaling, fq_mx_rows, fq_mx_cols),
}


def _plan(model, *args, recipe, backward=False):
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        plan, = model.fusion_plan(*args, requires_grad=True)
    ops = plan.backward_ops if backward else plan.forward_ops
    return [type(op).__name__ for op, _ in ops]


def _run_unfused(fn):
    from transformer_engine_cpp.ops.fuser import OperationFuser
    saved = (OperationFuser.forward_fusion_functions, OperationFuser.backward_fusion_functions)
    OperationFuser.forward_fusion_functions = ()
    OperationFuser.backward_fusion_functions = ()
    OperationFuser._fusion_registry_version += 1
    try:
        return fn()
    finally:
        OperationFuser.forward_fusion_functions, OperationFuser.backward_fusion_functions = saved
        OperationFuser._fusion_registry_version += 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_linear_bias_is_one_fp8_gemm_with_a_bias_epilogue(recipe_name, dtype):
    make_recipe, fq_rows, _ = RECIPES[recipe_name]
    recipe = make_recipe()
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 32, dtype=dtype))
    with torch.no_grad():
        model[0].bias.normal_()
    x = torch.randn(2, 32, 64).to(dtype).requires_grad_()
    dy = torch.randn(2, 32, 32).to(dtype)
    assert _plan(model, x, recipe=recipe) == ["ForwardLinearBiasActivation"]
    with te.autocast(recipe=recipe):
        y = model(x)
    y.backward(dy)
    w, b = model[0].weight.detach(), model[0].bias.detach()
    # fp32 accumulation, the bias added in fp32, one rounding
    ref = fq_rows(x.detach(), E4M3) @ fq_rows(w, E4M3).t() + b.double()
    torch.testing.assert_close(y.double(), ref, **tols(dtype))
    got = [y.detach(), x.grad, model[0].weight.grad, model[0].bias.grad]

    def unfused():
        m = te.ops.Sequential(te.ops.Linear(64, 32, dtype=dtype))
        m.load_state_dict(model.state_dict())
        assert _plan(m, x, recipe=recipe) == ["BasicLinear", "Bias"]
        xu = x.detach().clone().requires_grad_()
        with te.autocast(recipe=recipe):
            yu = m(xu)
        yu.backward(dy)
        return [yu.detach(), xu.grad, m[0].weight.grad, m[0].bias.grad]

    want = _run_unfused(unfused)
    # the unfused ops round the GEMM's output before adding the bias: a second rounding
    gemm = (fq_rows(x.detach(), E4M3) @ fq_rows(w, E4M3).t()).float().to(dtype)
    torch.testing.assert_close(want[0].float(), (gemm.float() + b.float()).to(dtype).float(),
                               rtol=0, atol=0)
    assert not torch.equal(got[0], want[0])
    for a, b_ in zip(got[1:], want[1:]):  # the same backward, dy quantized by the Bias' emit
        torch.testing.assert_close(a, b_, rtol=0, atol=0)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_bias_add_in_place_accumulates_the_fp8_gemm_into_the_residual(dtype, with_bias):
    recipe = te.recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 32, bias=with_bias, dtype=dtype),
                              te.ops.AddExtraInput(in_place=True))
    if with_bias:
        with torch.no_grad():
            model[0].bias.normal_()
    x = torch.randn(32, 64).to(dtype).requires_grad_()
    residual = torch.randn(32, 32).to(dtype)
    assert _plan(model, x, residual, recipe=recipe) == ["ForwardLinearBiasAdd"]
    buffer = residual.clone()
    with te.autocast(recipe=recipe):
        y = model(x, buffer)
    assert y.data_ptr() == buffer.data_ptr()  # TransformerEngine's: written into the residual
    w = model[0].weight.detach()
    ref = fq_current(x.detach(), E4M3) @ fq_current(w, E4M3).t() + residual.double()
    if with_bias:
        ref = ref + model[0].bias.detach().double()
    torch.testing.assert_close(y.double(), ref, **tols(dtype))
    dy = torch.randn(32, 32).to(dtype)
    y.backward(dy)
    torch.testing.assert_close(x.grad.double(),
                               fq_current(dy, E5M2) @ fq_current(w, E4M3), **tols(dtype))


def test_linear_scale_add_in_place_with_a_quantize_after_it():
    recipe = te.recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 32, bias=False), te.ops.ConstantScale(0.25),
                              te.ops.AddExtraInput(in_place=True), te.ops.Quantize())
    x = torch.randn(32, 64, requires_grad=True)
    residual = torch.randn(32, 32)
    assert _plan(model, x, residual, recipe=recipe) == ["ForwardLinearScaleAdd", "Quantize"]
    with te.autocast(recipe=recipe):
        y = model(x, residual.clone())
    w = model[0].weight.detach()
    ref = 0.25 * (fq_current(x.detach(), E4M3) @ fq_current(w, E4M3).t()) + residual.double()
    # the Quantize after it: the residual sum quantized (its dequantized values here)
    torch.testing.assert_close(y.double(), fq_current(ref.float(), E4M3), **tols(torch.float32))


def test_our_extensions_stay_off_under_a_recipe():
    recipe = te.recipe.Float8CurrentScaling()
    model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU())  # fp32: no TE fusion
    x = torch.randn(4, 32)
    assert _plan(model, x, recipe=recipe) == ["BasicLinear", "Bias", "GELU"]
    functional_add = te.ops.Sequential(te.ops.Linear(32, 32, dtype=torch.bfloat16),
                                       te.ops.AddExtraInput(in_place=False))
    xb, r = x.to(torch.bfloat16), torch.randn(4, 32, dtype=torch.bfloat16)
    # TransformerEngine's bias fusion applies; the functional add (our extension) does not
    assert _plan(functional_add, xb, r, recipe=recipe) == ["ForwardLinearBiasActivation",
                                                            "AddExtraInput"]
    assert _plan(functional_add, xb, r, recipe=None) == ["ForwardLinearBiasAdd"]


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_compiled_fusions_under_a_recipe_equal_eager(recipe_name):
    recipe = RECIPES[recipe_name][0]()
    torch.manual_seed(0)

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(64, 64, dtype=torch.bfloat16),
                                 te.ops.AddExtraInput(in_place=True),
                                 te.ops.Linear(64, 32, dtype=torch.bfloat16))

    eager, comp = make(), make()
    compiled = torch.compile(comp, backend="aot_eager", fullgraph=True)
    results = []
    for model in (eager, compiled):
        torch.manual_seed(1)
        x = torch.randn(64, 64).to(torch.bfloat16).requires_grad_()
        r = torch.randn(64, 64).to(torch.bfloat16)
        with te.autocast(recipe=recipe):
            y = model(x, r)
        y.backward(torch.randn(64, 32).to(torch.bfloat16))
        results.append([y.detach(), x.grad, *[p.grad for p in model.parameters()]])
    assert _plan(eager, torch.randn(64, 64, dtype=torch.bfloat16),
                 torch.randn(64, 64, dtype=torch.bfloat16),
                 recipe=recipe) == ["ForwardLinearBiasAdd", "ForwardLinearBiasActivation"]
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8BlockScaling, te.recipe.NVFP4BlockScaling],
                         ids=["block", "nvfp4"])
def test_linear_bias_fusion_under_block_and_nvfp4_recipes(recipe_cls):
    """The same fusion under the block-scaled recipes: the GEMM of the operands' dequantized
    values (as the op's own quantizers make them) plus the bias, rounded once; the backward the
    unfused ops' bit for bit; compiled equal to eager."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    model = te.ops.Sequential(te.ops.Linear(128, 64, dtype=dtype))
    with torch.no_grad():
        model[0].bias.normal_()
    x = torch.randn(128, 128).to(dtype).requires_grad_()
    dy = torch.randn(128, 64).to(dtype)
    assert _plan(model, x, recipe=recipe_cls()) == ["ForwardLinearBiasActivation"]

    def step(m, compiled=False):
        torch.manual_seed(5)  # NVFP4's stochastic rounding of dy draws its seeds from torch
        xs = x.detach().clone().requires_grad_()
        f = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        with te.autocast(recipe=recipe_cls()):
            y = f(xs)
        y.backward(dy)
        return [y.detach(), xs.grad, m[0].weight.grad, m[0].bias.grad]

    got = step(model)
    linear = model[0].basic_ops[0]
    w = model[0].weight.detach()
    xq = linear.get_quantizer("forward", 0).quantize_storage(x.detach())
    wq = linear.get_quantizer("forward", 1).quantize_storage(w)
    ref = (xq.dequantize_rowwise(torch.float64) @ wq.dequantize_rowwise(torch.float64).t()
           + model[0].bias.detach().double())
    torch.testing.assert_close(got[0].double(), ref, **tols(dtype))

    def unfused():
        m = te.ops.Sequential(te.ops.Linear(128, 64, dtype=dtype))
        m.load_state_dict(model.state_dict())
        return step(m)

    want = _run_unfused(unfused)
    for a, b in zip(got[1:], want[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    comp = te.ops.Sequential(te.ops.Linear(128, 64, dtype=dtype))
    comp.load_state_dict(model.state_dict())
    for a, b in zip(step(comp, compiled=True), got):
        torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)
