"""GroupedLinear under the FP8 recipes (TransformerEngine's split-quantize path): each group's
rows quantized with the group's own quantizers, against an independent emulation in float64
built per group from the pure-PyTorch quantizers of tests/test_fp8_quantize.py; the per-group
quantize ops against the per-tensor ones on each split; delayed scaling's per-group amaxes and
scales; MXFP8's split-size rule; quantized weights (te.quantized_model_init); compiled equal to
eager; the fused grouped MLP under a recipe."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import transformer_engine_cpp as te
from test_fp8_ops import fq_current, fq_mx_cols, fq_mx_rows
from test_fp8_quantize import E4M3, E5M2, ref_current
from test_grouped_ops import _groups
from tolerances import COMPILED_VS_EAGER, tols

ops = torch.ops.te_cpp


def _per_group(t, splits, fq):
    """t's rows quantized group by group with fq (float64 values)."""
    return torch.cat([fq(t[r0:r1], None) if r1 > r0 else t[r0:r1].double()
                      for r0, r1 in _groups(splits)])


RECIPES = {
    # name: (recipe, quantize rows, quantize columns), fq(t, fmt) -> float64
    "current": (te.recipe.Float8CurrentScaling, fq_current, fq_current),
    "current_e4m3": (lambda: te.recipe.Float8CurrentScaling(fp8_format=te.recipe.Format.E4M3),
                     fq_current, fq_current),
    "mxfp8": (te.recipe.MXFP8BlockScaling, fq_mx_rows, fq_mx_cols),
}
SPLITS = {  # multiples of 32 so that MXFP8 takes them too
    "uneven_with_empty": [64, 0, 32, 96],
    "one_group_has_all": [0, 128, 0],
    "single": [64],
}


def _formats(recipe):
    return E4M3, (E4M3 if recipe.fp8_format == te.recipe.Format.E4M3 else E5M2)


def _reference(op, x, dy, splits, probs, fq_rows, fq_cols, fwd_fmt, bwd_fmt):
    """y, dx, dW_g, db_g, dprobs of the FP8 GEMMs in float64: x and dy quantized per group, each
    weight on its own; dbias and dprobs from the high-precision dy (as TransformerEngine)."""
    rows = lambda fmt: (lambda t, _: fq_rows(t, fmt))  # noqa: E731
    cols = lambda fmt: (lambda t, _: fq_cols(t, fmt))  # noqa: E731
    xr = _per_group(x, splits, rows(fwd_fmt))
    xc = _per_group(x, splits, cols(fwd_fmt))
    dyr = _per_group(dy, splits, rows(bwd_fmt))
    dyc = _per_group(dy, splits, cols(bwd_fmt))
    y, dx, dws, dbs, dp = [], [], [], [], []
    for g, (r0, r1) in enumerate(_groups(splits)):
        w = op.weights()[g].detach()
        b = op.biases()[g].detach().double()
        s = probs[r0:r1].double()[:, None]
        y.append(xr[r0:r1] @ fq_rows(w, fwd_fmt).t() + s * b)
        dx.append(dyr[r0:r1] @ fq_cols(w, fwd_fmt))
        dws.append(dyc[r0:r1].t() @ xc[r0:r1])
        dbs.append((s * dy[r0:r1].double()).sum(0))
        dp.append(dy[r0:r1].double() @ b)
    return torch.cat(y), torch.cat(dx), dws, dbs, torch.cat(dp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_fp8_grouped_linear_matches_the_per_group_emulation(recipe_name, splits, dtype):
    make_recipe, fq_rows, fq_cols = RECIPES[recipe_name]
    recipe = make_recipe()
    fwd_fmt, bwd_fmt = _formats(recipe)
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(len(splits), 64, 32, scale_bias=True, dtype=dtype)
    with torch.no_grad():
        for b in op.biases():
            b.normal_()
    total = sum(splits)
    x = (torch.randn(total, 64) * torch.linspace(0.1, 1, total)[:, None]).to(dtype)
    x.requires_grad_()
    probs = torch.rand(total, dtype=dtype, requires_grad=True)
    dy = torch.randn(total, 32).to(dtype)
    split_t = torch.tensor(splits)
    with te.autocast(recipe=recipe):
        y = op(x, split_t, probs)
    y.backward(dy)
    y_ref, dx_ref, dws_ref, dbs_ref, dp_ref = _reference(
        op, x.detach(), dy, splits, probs.detach(), fq_rows, fq_cols, fwd_fmt, bwd_fmt)
    # the fp32 GEMMs of the quantized values, rounded once to the compute dtype
    t = tols(dtype)
    torch.testing.assert_close(y.double(), y_ref, **t)
    torch.testing.assert_close(x.grad.double(), dx_ref, **t)
    for w, b, dw_ref, db_ref in zip(op.weights(), op.biases(), dws_ref, dbs_ref):
        torch.testing.assert_close(w.grad.double(), dw_ref, **t)
        torch.testing.assert_close(b.grad.double(), db_ref, **t)
    torch.testing.assert_close(probs.grad.double(), dp_ref, **t)
    # each group has its own scales: quantizing the whole input at once differs
    if recipe_name != "mxfp8" and len([n for n in splits if n]) > 1:
        whole = fq_rows(x.detach(), fwd_fmt)
        assert not torch.allclose(whole, torch.cat([fq_rows(x.detach()[r0:r1], fwd_fmt)
                                                    for r0, r1 in _groups(splits)]))


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_grouped_fp8_quantize_is_the_per_tensor_quantize_of_each_split(fmt, pow2):
    splits = [3, 0, 1, 6, 2]
    x = torch.randn(12, 24) * torch.linspace(0.01, 100, 12)[:, None]
    eps = [0.0, 0.5, 0.0, 1e-3, 0.0]
    data, scale_inv, amax = ops.grouped_fp8_quantize(x, torch.tensor(splits), None, fmt, pow2,
                                                     eps)
    for g, (r0, r1) in enumerate(_groups(splits)):
        d, si, a = ops.fp8_quantize(x[r0:r1], fmt, pow2, eps[g])
        assert torch.equal(data[r0:r1], d)
        assert torch.equal(scale_inv[g:g + 1], si) and torch.equal(amax[g:g + 1], a)
        rd, rsi, _ = ref_current(x[r0:r1], fmt, pow2, eps[g])
        assert torch.equal(data[r0:r1], rd.view(torch.uint8)) and torch.equal(scale_inv[g:g + 1],
                                                                              rsi)
    back = ops.grouped_fp8_dequantize(data, torch.tensor(splits), scale_inv, fmt, torch.float32)
    for g, (r0, r1) in enumerate(_groups(splits)):
        assert torch.equal(back[r0:r1],
                           ops.fp8_dequantize(data[r0:r1], scale_inv[g:g + 1], fmt,
                                              torch.float32))
    # delayed scaling: the given scale per group, the amax recorded per group
    scales = torch.tensor([1.0, 2.0, 0.5, 4.0, 8.0])
    data, scale_inv, amax = ops.grouped_fp8_quantize(x, torch.tensor(splits), scales, fmt,
                                                     False, [0.0] * 5)
    for g, (r0, r1) in enumerate(_groups(splits)):
        d, si, a = ops.fp8_quantize_scaled(x[r0:r1], scales[g:g + 1], fmt)
        assert torch.equal(data[r0:r1], d) and torch.equal(scale_inv[g:g + 1], si)
        assert torch.equal(amax[g:g + 1], a)


def test_grouped_mxfp8_quantize_blocks_stay_within_groups():
    x = torch.randn(96, 64)
    splits = torch.tensor([32, 0, 64])
    rd, rs, cd, cs = ops.grouped_mxfp8_quantize(x, splits, E4M3, True, True)
    d, s = ops.mxfp8_quantize(x, E4M3)
    assert torch.equal(rd, d) and torch.equal(rs, s)
    for r0, r1 in ((0, 32), (32, 96)):  # the columnwise copy of each group on its own
        d, s = ops.mxfp8_quantize(x[r0:r1].t().contiguous(), E4M3)
        assert torch.equal(cd[:, r0:r1], d) and torch.equal(cs[:, r0 // 32:r1 // 32], s)
    rd, rs, cd, cs = ops.grouped_mxfp8_quantize(x, splits, E4M3, True, False)
    assert cd.shape == (0,) and cs.shape == (0,) and rd.shape == (96, 64)
    with pytest.raises(ValueError, match=r"grouped_mxfp8_quantize: split_sizes\[0\] is 40; "
                                           r".*multiple of 32"):
        ops.grouped_mxfp8_quantize(x, torch.tensor([40, 56]), E4M3, True, True)
    # rowwise only (inference): any split
    ops.grouped_mxfp8_quantize(x, torch.tensor([40, 56]), E4M3, True, False)
    with pytest.raises(ValueError, match="amax_epsilons"):
        ops.grouped_fp8_quantize(x, splits, None, E4M3, False, [0.0])
    with pytest.raises(RuntimeError, match=r"scales must have shape \[3\]"):
        ops.grouped_fp8_quantize(x, splits, torch.ones(2), E4M3, False, [0.0] * 3)


def test_mxfp8_splits_not_multiples_of_32_are_a_clear_error_in_training_only():
    op = te.ops.GroupedLinear(2, 64, 32)
    x = torch.randn(64, 64, requires_grad=True)
    with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
        with pytest.raises(ValueError, match=r"split_sizes\[0\] is 20"):
            op(x, torch.tensor([20, 44]))
        with torch.no_grad():  # no wgrad, no columnwise copy: any split
            y = op(x, torch.tensor([20, 44]))
    assert y.shape == (64, 32)


def test_delayed_scaling_keeps_an_amax_and_a_scale_per_group():
    torch.manual_seed(0)
    splits = [4, 0, 6]
    op = te.ops.GroupedLinear(3, 16, 8)
    x = torch.randn(10, 16) * torch.tensor([1.0] * 4 + [50.0] * 6)[:, None]
    x.requires_grad_()
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor(splits))
    y.backward(torch.randn(10, 8))
    fwd = op._fp8_metas["forward"]
    # quantizer 2g is group g's input, 2g + 1 its weight; the update rolled the recorded row
    # to the end of the history
    amax_in = fwd.amax_history[-1, 0::2]
    x_abs = x.detach().abs()
    torch.testing.assert_close(amax_in, torch.stack([x_abs[:4].max(), torch.tensor(0.0),
                                                     x_abs[4:].max()]), rtol=0, atol=0)
    amax_w = fwd.amax_history[-1, 1::2]
    torch.testing.assert_close(amax_w, torch.stack([w.detach().abs().max()
                                                    for w in op.weights()]), rtol=0, atol=0)
    # the next forward quantizes each group with its own scale
    scales = fwd.scale.clone()
    assert scales[0] != scales[4]
    x2 = x.detach()
    with te.autocast(recipe=recipe):
        y2 = op(x2, torch.tensor(splits))
    ref = []
    for g, (r0, r1) in enumerate(_groups(splits)):
        if r1 == r0:
            continue
        xd, xs, _ = ops.fp8_quantize_scaled(x2[r0:r1], scales[2 * g:2 * g + 1], E4M3)
        wd, ws, _ = ops.fp8_quantize_scaled(op.weights()[g].detach(),
                                            scales[2 * g + 1:2 * g + 2], E4M3)
        ref.append(ops.fp8_dequantize(xd, xs, E4M3, torch.float64)
                   @ ops.fp8_dequantize(wd, ws, E4M3, torch.float64).t()
                   + op.biases()[g].detach().double())
    torch.testing.assert_close(y2.detach().double(), torch.cat(ref), **tols(torch.float32))
    # and under torch.compile it is refused, as for every op
    with pytest.raises(Exception, match="DelayedScaling"):
        with te.autocast(recipe=recipe):
            torch.compile(te.ops.Sequential(op), fullgraph=True, backend="eager")(
                x2, torch.tensor(splits))


@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_compiled_equals_eager_under_a_recipe(recipe_name):
    recipe = RECIPES[recipe_name][0]()
    splits = [64, 0, 32, 32]
    torch.manual_seed(0)
    eager = te.ops.Sequential(te.ops.GroupedLinear(4, 32, 64, scale_bias=True))
    comp = te.ops.Sequential(te.ops.GroupedLinear(4, 32, 64, scale_bias=True))
    comp.load_state_dict(eager.state_dict())
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(comp, backend=backend, fullgraph=True)
    results = []
    for model in (eager, compiled):
        torch.manual_seed(1)
        x = torch.randn(128, 32, requires_grad=True)
        p = torch.rand(128, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = model(x, torch.tensor(splits), p)
        y.backward(torch.randn(128, 64))
        results.append([y.detach(), x.grad, p.grad, *[q.grad for q in model.parameters()]])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)
    fw = "\n".join(g.code for g in backend.fw_graphs)
    bw = "\n".join(g.code for g in backend.bw_graphs)
    quantize = ("te_cpp.grouped_mxfp8_quantize.default(" if recipe_name == "mxfp8"
                else "te_cpp.grouped_fp8_quantize.default(")
    assert fw.count(quantize) == 1 and bw.count(quantize) == 1
    gemm = ("te_cpp.grouped_linear_fwd.default(" if recipe_name == "mxfp8"
            else "te_cpp.grouped_fp8_linear_fwd.default(")
    assert fw.count(gemm) == 1
    # the backward saves the quantized bytes (and scales), never a dequantized operand: every
    # saved floating tensor besides the parameters is a scale (at most one per group) or the
    # bias scales' input
    for g in backend.bw_graphs:
        for n in g.graph.nodes:
            if n.op != "placeholder" or n.name.startswith(("tangents", "primals")):
                continue
            v = n.meta["val"]
            assert not v.is_floating_point() or v.numel() <= 128, (n.name, v.dtype, v.shape)


def test_quantized_weights_from_quantized_model_init():
    recipe = te.recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        op = te.ops.GroupedLinear(3, 32, 16)
    assert [type(w).__name__ for w in op.weights()] == ["Float8Tensor"] * 3
    assert [k for k in op.state_dict() if k != "_extra_state"] == [
        *[f"weight{i}" for i in range(3)], *[f"bias{i}" for i in range(3)]]
    splits = [5, 0, 7]
    x = torch.randn(12, 32, requires_grad=True)
    dy = torch.randn(12, 16)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor(splits))
    y.backward(dy)
    ref_y, ref_dx = [], []
    for g, (r0, r1) in enumerate(_groups(splits)):
        w = op.weights()[g].dequantize().double()  # its own FP8 values, not quantized again
        ref_y.append(_per_group(x.detach()[r0:r1], [r1 - r0], lambda t, _: fq_current(t, E4M3))
                     @ w.t())
        ref_dx.append(fq_current(dy[r0:r1], E5M2) @ w if r1 > r0
                      else torch.zeros(0, 32, dtype=torch.float64))
    torch.testing.assert_close(y.detach().double(), torch.cat(ref_y), **tols(torch.float32))
    torch.testing.assert_close(x.grad.double(), torch.cat(ref_dx), **tols(torch.float32))
    # an optimizer step updates them in place: they stay FP8
    before = op.weights()[0].dequantize().clone()
    torch.optim.SGD(op.parameters(), lr=0.5).step()
    assert type(op.weights()[0]).__name__ == "Float8Tensor"
    assert not torch.equal(op.weights()[0].dequantize(), before)
    # outside autocast they are used dequantized
    y_hp = op(x.detach(), torch.tensor(splits))
    torch.testing.assert_close(
        y_hp[:5], x.detach()[:5] @ op.weights()[0].dequantize().t() + op.biases()[0].detach(),
        **tols(torch.float32))
    with te.quantized_model_init(recipe=te.recipe.MXFP8BlockScaling()):
        mx = te.ops.GroupedLinear(2, 32, 32)
    assert [type(w).__name__ for w in mx.weights()] == ["MXFP8Tensor"] * 2
    xm = torch.randn(64, 32, requires_grad=True)
    with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
        ym = mx(xm, torch.tensor([32, 32]))
    ym.sum().backward()
    torch.testing.assert_close(
        ym[:32].double(), fq_mx_rows(xm.detach()[:32], E4M3)
        @ mx.weights()[0].dequantize().double().t() + mx.biases()[0].detach().double(),
        **tols(torch.float32))


def test_bias_only_training_and_input_without_grad_under_fp8():
    recipe = te.recipe.Float8CurrentScaling()
    op = te.ops.GroupedLinear(2, 16, 8)
    for w in op.weights():
        w.requires_grad_(False)
    x = torch.randn(6, 16)
    dy = torch.randn(6, 8)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor([2, 4]))
    y.backward(dy)
    torch.testing.assert_close(op.biases()[0].grad, dy[:2].sum(0), **tols(torch.float32))
    torch.testing.assert_close(op.biases()[1].grad, dy[2:].sum(0), **tols(torch.float32))
    # weights trained, input without grad: wgrad only
    for w in op.weights():
        w.requires_grad_(True)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor([2, 4]))
    y.backward(dy)
    ref = fq_current(dy[:2], E5M2).t() @ fq_current(x[:2], E4M3)
    torch.testing.assert_close(op.weights()[0].grad.double(), ref, **tols(torch.float32))


@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_fused_grouped_mlp_under_a_recipe_equals_the_unfused_ops(recipe_name):
    recipe = RECIPES[recipe_name][0]()
    splits = [32, 64, 0, 32]

    def mlp():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.GroupedLinear(4, 32, 128), te.ops.ScaledSwiGLU(),
                                 te.ops.GroupedLinear(4, 64, 32))

    def step(model):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(128, 32, generator=g, requires_grad=True)
        p = torch.rand(128, generator=g, requires_grad=True)
        s = torch.tensor(splits)
        with te.autocast(recipe=recipe):
            y = model(x, s, p, s)
        y.backward(torch.randn(128, 32, generator=g))
        return [y.detach(), x.grad, p.grad, *[q.grad for q in model.parameters()]]

    fused = mlp()
    with te.autocast(recipe=recipe):
        plan, = fused.fusion_plan(torch.randn(128, 32), torch.tensor(splits), torch.rand(128),
                                  torch.tensor(splits), requires_grad=True)
    assert [type(op).__name__ for op, _ in plan.forward_ops] == ["GroupedMLP"]
    got = step(fused)
    from transformer_engine_cpp.ops.fuser import OperationFuser
    saved = OperationFuser.extension_forward_backward_fusion_functions
    OperationFuser.extension_forward_backward_fusion_functions = ()
    OperationFuser._fusion_registry_version += 1
    try:
        want = step(mlp())
    finally:
        OperationFuser.extension_forward_backward_fusion_functions = saved
        OperationFuser._fusion_registry_version += 1
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_realistic_step_under_current_scaling():
    """8 experts, 4096 rows (uneven, one expert empty), 1024 -> 1024, bf16: forward, dgrad and
    wgrad against the per-group float64 emulation."""
    splits = [512, 1024, 0, 256, 768, 512, 640, 384]
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(8, 1024, 1024, dtype=torch.bfloat16)
    x = torch.randn(4096, 1024).to(torch.bfloat16).requires_grad_()
    dy = (torch.randn(4096, 1024) * 0.03).to(torch.bfloat16)  # a gradient's magnitude
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = op(x, torch.tensor(splits))
    y.backward(dy)
    t = tols(torch.bfloat16)
    fq = lambda fmt: (lambda v, _: fq_current(v, fmt))  # noqa: E731
    xq, dyq = _per_group(x.detach(), splits, fq(E4M3)), _per_group(dy, splits, fq(E5M2))
    for g, (r0, r1) in enumerate(_groups(splits)):
        w = op.weights()[g]
        wq = fq_current(w.detach(), E4M3)
        torch.testing.assert_close(y[r0:r1].double(), xq[r0:r1] @ wq.t(), **t)
        torch.testing.assert_close(x.grad[r0:r1].double(), dyq[r0:r1] @ wq, **t)
        torch.testing.assert_close(w.grad.double(), dyq[r0:r1].t() @ xq[r0:r1], **t)


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8BlockScaling, te.recipe.NVFP4BlockScaling])
def test_block_and_nvfp4_recipes_are_refused_clearly(recipe_cls):
    """Not implemented yet for GroupedLinear (per-group block and NVFP4 quantization, its
    quantized weights too): an error naming the op and the quantizer, not a wrong answer."""
    recipe = recipe_cls()
    name = "Float8BlockQuantizer" if recipe_cls is te.recipe.Float8BlockScaling \
        else "NVFP4Quantizer"
    op = te.ops.GroupedLinear(2, 128, 128, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=f"GroupedLinear: quantization with {name}"):
        with te.autocast(recipe=recipe):
            op(torch.randn(64, 128, dtype=torch.bfloat16), torch.tensor([32, 32]))
    with pytest.raises(NotImplementedError,
                       match=f"quantized weights .* not implemented for {name}"):
        with te.quantized_model_init(recipe=recipe):
            te.ops.GroupedLinear(2, 128, 128)


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8CurrentScaling,
                                        te.recipe.MXFP8BlockScaling], ids=["current", "mxfp8"])
@pytest.mark.parametrize("grouped", [True, False], ids=["GroupedLinear", "Linear"])
def test_quantized_weights_compiled_before_any_eager_call(grouped, recipe_cls):
    """The first call compiled: the plan (and the binding of each quantized weight to the op's
    weight quantizer) is built while torch.compile traces; the result equals eager and the
    weights are bound."""
    recipe = recipe_cls()
    with te.quantized_model_init(recipe=recipe):
        model = te.ops.Sequential(te.ops.GroupedLinear(2, 64, 64) if grouped
                                  else te.ops.Linear(64, 64))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(64, 64, requires_grad=True)
    args = (x, torch.tensor([32, 32])) if grouped else (x,)
    with te.autocast(recipe=recipe):
        y = compiled(*args)
    y.sum().backward()
    op = model[0] if grouped else model[0].basic_ops[0]
    weights = op.weights() if grouped else [op.weight]
    for i, w in enumerate(weights):
        assert w._quantizer is op.get_quantizer("forward", 2 * i + 1 if grouped else 1)
    with te.autocast(recipe=recipe):
        assert torch.equal(model(*args), y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_edge_inputs_under_a_recipe(recipe_name, dtype):
    """fp16 / bf16, a non-contiguous input (equal to its contiguous copy's result), no tokens
    at all (zero gradients), and inference_mode (equal to the grad-mode output)."""
    recipe = RECIPES[recipe_name][0]()
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(3, 64, 32, dtype=dtype)
    splits = torch.tensor([32, 0, 32])
    base = torch.randn(64, 64).to(dtype)
    outs = []
    for x in (base.t(), base.t().contiguous()):
        x = x.detach().requires_grad_()
        for w in op.parameters():
            w.grad = None
        with te.autocast(recipe=recipe):
            y = op(x, splits)
        y.float().sum().backward()
        outs.append([y.detach(), x.grad, *[w.grad for w in op.parameters()]])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.inference_mode(), te.autocast(recipe=recipe):
        y_inf = op(base.t(), splits)
    assert y_inf.is_inference() and torch.equal(y_inf, outs[0][0])
    x0 = torch.randn(0, 64, dtype=dtype, requires_grad=True)
    for w in op.parameters():
        w.grad = None
    with te.autocast(recipe=recipe):
        y0 = op(x0, torch.tensor([0, 0, 0]))
    y0.sum().backward()
    assert y0.shape == (0, 32) and x0.grad.shape == (0, 64)
    assert all(torch.count_nonzero(w.grad) == 0 for w in op.parameters())
