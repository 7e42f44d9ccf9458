"""GroupedLinear under the quantization recipes (TransformerEngine's split-quantize path): each
group's rows quantized with the group's own quantizers, against an independent emulation in
float64 built per group from the pure-PyTorch quantizers of tests/test_fp8_quantize.py,
tests/test_fp8_block_scaling.py and tests/test_nvfp4.py; the per-group quantize ops against the
per-tensor ones on each split; delayed scaling's per-group amaxes and scales; the split-size
rules of MXFP8 and NVFP4; the quantizer roles of every group; quantized weights
(te.quantized_model_init); compiled equal to eager; the fused grouped MLP under a recipe."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import transformer_engine_cpp as te
from harness import (check_quantized_weights_compile_checkpoint_cast,
                     eager_and_inductor_grads)
from test_fp8_block_scaling import fq as fq_block, fq_cols as fq_block_cols
from test_fp8_ops import fq_current, fq_mx_cols, fq_mx_rows
from test_fp8_quantize import E4M3, E5M2, ref_current
from test_grouped_ops import _groups
from test_nvfp4 import ref_dequantize as nvfp4_ref_dequantize, ref_quantize as nvfp4_ref_quantize
from tolerances import COMPILED_VS_EAGER, tols

ops = torch.ops.te_cpp


def _per_group(t, splits, fq):
    """t's rows quantized group by group with fq (float64 values)."""
    return torch.cat([fq(t[r0:r1], None) if r1 > r0 else t[r0:r1].double()
                      for r0, r1 in _groups(splits)])


def _nvfp4_fq(t, rht=False, block_2d=False):
    """NVFP4's round trip of t (rowwise: blocks of 16 along the last dim), float64."""
    return nvfp4_ref_dequantize(*nvfp4_ref_quantize(t, rht, block_2d), rht=rht).double()


def _nvfp4_fq_cols(t, rht=False, block_2d=False):
    return _nvfp4_fq(t.t().contiguous(), rht, block_2d).t()


class Emulation:
    """A recipe's quantizations as float64 values: x, dy and the weights, each as the rowwise
    copy (the GEMMs that reduce over the features) and the columnwise copy (wgrad's operands,
    and the weight's for dgrad)."""

    def __init__(self, x_rows, x_cols, w_rows, w_cols, dy_rows, dy_cols):
        self.x_rows, self.x_cols, self.w_rows, self.w_cols = x_rows, x_cols, w_rows, w_cols
        self.dy_rows, self.dy_cols = dy_rows, dy_cols


def _bwd_format(recipe):
    return E4M3 if recipe.fp8_format == te.recipe.Format.E4M3 else E5M2


def _fp8_emulation(fq_rows, fq_cols, bwd_fmt):
    return Emulation(lambda t: fq_rows(t, E4M3), lambda t: fq_cols(t, E4M3),
                     lambda t: fq_rows(t, E4M3), lambda t: fq_cols(t, E4M3),
                     lambda t: fq_rows(t, bwd_fmt), lambda t: fq_cols(t, bwd_fmt))


def _block_emulation(recipe):
    bwd = _bwd_format(recipe)
    qx, qw, qg = recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad
    xd, wd, gd = (recipe.x_block_scaling_dim, recipe.w_block_scaling_dim,
                  recipe.grad_block_scaling_dim)

    def pair(fmt, dim, qp):
        args = (fmt, dim, qp.power_2_scale, qp.amax_epsilon)
        return (lambda t: fq_block(t, *args)), (lambda t: fq_block_cols(t, *args))

    return Emulation(*pair(E4M3, xd, qx), *pair(E4M3, wd, qw), *pair(bwd, gd, qg))


def _nvfp4_emulation(recipe):
    """Stochastic rounding off (the emulation cannot draw the seeds): input and grad with the
    random Hadamard transform on their columnwise copies, weights in 16x16 tiles."""
    rht = not recipe.disable_rht
    two_d = not recipe.disable_2d_quantization
    return Emulation(_nvfp4_fq, lambda t: _nvfp4_fq_cols(t, rht),
                     lambda t: _nvfp4_fq(t, block_2d=two_d),
                     lambda t: _nvfp4_fq_cols(t, block_2d=two_d),
                     _nvfp4_fq, lambda t: _nvfp4_fq_cols(t, rht))


RECIPES = {
    # name: (recipe, emulation of the recipe, (in_features, out_features))
    "current": (te.recipe.Float8CurrentScaling,
                lambda r: _fp8_emulation(fq_current, fq_current, _bwd_format(r)), (64, 32)),
    "current_e4m3": (lambda: te.recipe.Float8CurrentScaling(fp8_format=te.recipe.Format.E4M3),
                     lambda r: _fp8_emulation(fq_current, fq_current, _bwd_format(r)), (64, 32)),
    "mxfp8": (te.recipe.MXFP8BlockScaling,
              lambda r: _fp8_emulation(fq_mx_rows, fq_mx_cols, _bwd_format(r)), (64, 32)),
    # 1x128 blocks for x and dy, 128x128 tiles for the weights; features past one block
    "block": (te.recipe.Float8BlockScaling, _block_emulation, (160, 144)),
    # x in 128x128 tiles (per group), weights in 1x128 blocks, epsilons, HYBRID
    "block_x2d_hybrid": (lambda: te.recipe.Float8BlockScaling(
        fp8_format=te.recipe.Format.HYBRID, x_block_scaling_dim=2, w_block_scaling_dim=1,
        fp8_quant_fwd_inp=te.recipe.QParams(power_2_scale=False, amax_epsilon=1e-2),
        fp8_quant_fwd_weight=te.recipe.QParams(power_2_scale=False),
        fp8_quant_bwd_grad=te.recipe.QParams(power_2_scale=True, amax_epsilon=1e-3)),
        _block_emulation, (160, 144)),
    "nvfp4": (lambda: te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
              _nvfp4_emulation, (64, 32)),
    "nvfp4_no_rht_1d": (lambda: te.recipe.NVFP4BlockScaling(
        disable_stochastic_rounding=True, disable_rht=True, disable_2d_quantization=True),
        _nvfp4_emulation, (48, 32)),
}
SPLITS = {  # multiples of 32 so that MXFP8 (and NVFP4, 16) take them too
    "uneven_with_empty": [64, 0, 32, 96],
    "one_group_has_all": [0, 128, 0],
    "single": [64],
    # not multiples of any block: the recipes whose blocks allow partial ones
    "ragged": [100, 0, 37, 155],
}
#: the split-size multiple a recipe needs for training (its columnwise copies' blocks down the
#: rows must not straddle two groups); 1: any split size (partial blocks)
ALIGNMENT = {"mxfp8": 32, "nvfp4": 16, "nvfp4_no_rht_1d": 16}
CASES = [(r, s) for r in RECIPES for s in SPLITS
         if all(n % ALIGNMENT.get(r, 1) == 0 for n in SPLITS[s])]


def _reference(op, x, dy, splits, probs, em):
    """y, dx, dW_g, db_g, dprobs of the quantized GEMMs in float64: x and dy quantized per
    group, each weight on its own; dbias and dprobs from the high-precision dy (as
    TransformerEngine)."""
    xr = _per_group(x, splits, lambda t, _: em.x_rows(t))
    xc = _per_group(x, splits, lambda t, _: em.x_cols(t))
    dyr = _per_group(dy, splits, lambda t, _: em.dy_rows(t))
    dyc = _per_group(dy, splits, lambda t, _: em.dy_cols(t))
    y, dx, dws, dbs, dp = [], [], [], [], []
    for g, (r0, r1) in enumerate(_groups(splits)):
        w = op.weights()[g].detach()
        b = op.biases()[g].detach().double()
        s = probs[r0:r1].double()[:, None]
        y.append(xr[r0:r1] @ em.w_rows(w).t() + s * b)
        dx.append(dyr[r0:r1] @ em.w_cols(w))
        dws.append(dyc[r0:r1].t() @ xc[r0:r1])
        dbs.append((s * dy[r0:r1].double()).sum(0))
        dp.append(dy[r0:r1].double() @ b)
    return torch.cat(y), torch.cat(dx), dws, dbs, torch.cat(dp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recipe_name,split_name", CASES, ids=[f"{r}-{s}" for r, s in CASES])
def test_quantized_grouped_linear_matches_the_per_group_emulation(recipe_name, split_name,
                                                                  dtype):
    make_recipe, make_emulation, (k, n) = RECIPES[recipe_name]
    splits = SPLITS[split_name]
    recipe = make_recipe()
    em = make_emulation(recipe)
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(len(splits), k, n, scale_bias=True, dtype=dtype)
    with torch.no_grad():
        for b in op.biases():
            b.normal_()
    total = sum(splits)
    x = (torch.randn(total, k) * torch.linspace(0.1, 1, total)[:, None]).to(dtype)
    x.requires_grad_()
    probs = torch.rand(total, dtype=dtype, requires_grad=True)
    dy = torch.randn(total, n).to(dtype)
    split_t = torch.tensor(splits)
    with te.autocast(recipe=recipe):
        y = op(x, split_t, probs)
    y.backward(dy)
    y_ref, dx_ref, dws_ref, dbs_ref, dp_ref = _reference(op, x.detach(), dy, splits,
                                                         probs.detach(), em)
    # the fp32 GEMMs of the quantized values, rounded once to the compute dtype
    t = tols(dtype)
    torch.testing.assert_close(y.double(), y_ref, **t)
    torch.testing.assert_close(x.grad.double(), dx_ref, **t)
    for w, b, dw_ref, db_ref in zip(op.weights(), op.biases(), dws_ref, dbs_ref):
        torch.testing.assert_close(w.grad.double(), dw_ref, **t)
        torch.testing.assert_close(b.grad.double(), db_ref, **t)
    torch.testing.assert_close(probs.grad.double(), dp_ref, **t)
    # each group has its own scales: quantizing the whole tensor at once differs (per-tensor
    # scales for the rows; block scales for blocks down the rows)
    if len([m for m in splits if m]) > 1 and recipe_name != "mxfp8":
        fq_whole = em.x_rows if recipe_name.startswith(("current", "nvfp4")) else em.x_cols
        whole = fq_whole(x.detach())
        assert not torch.equal(whole, _per_group(x.detach(), splits,
                                                 lambda t, _: fq_whole(t)))


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
    # a NaN is skipped by its group's amax (as fp8_quantize's): the group's scale is that of
    # its finite values
    xn = x.clone()
    xn[5, 3] = float("nan")  # group 3 (rows 4..9)
    _, scale_inv_n, amax_n = ops.grouped_fp8_quantize(xn, torch.tensor(splits), None, fmt,
                                                      pow2, eps)
    xz = xn.nan_to_num(0.0)
    _, scale_inv_z, amax_z = ops.grouped_fp8_quantize(xz, torch.tensor(splits), None, fmt,
                                                      pow2, eps)
    assert torch.equal(amax_n, amax_z) and torch.equal(scale_inv_n, scale_inv_z)
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


@pytest.mark.parametrize("block_dim", [1, 2])
def test_grouped_fp8_block_quantize_is_the_block_quantize_of_each_split(block_dim):
    """Each group's rows as fp8_block_quantize gives them for the split alone (its own blocks
    and tiles from the group's first row, partial ones at its end), the columnwise copy the
    quantization of each split's transpose; the scales of group g follow group g - 1's."""
    splits = [130, 0, 1, 256, 37]
    x = torch.randn(sum(splits), 200) * torch.exp2(torch.randint(-6, 6, (sum(splits), 200)))
    s = torch.tensor(splits)
    args = (E4M3, block_dim, False, 1e-3)
    data, scale = ops.grouped_fp8_block_quantize(x, s, *args, False)
    cdata, cscale = ops.grouped_fp8_block_quantize(x, s, *args, True)
    blocks = (sum(splits) + 127 * len(splits)) // 128  # the bound on sum(ceil(n_g / 128))
    assert data.shape == x.shape and cdata.shape == x.t().shape
    assert scale.shape == ((sum(splits), 2) if block_dim == 1 else (blocks, 2))
    assert cscale.shape == ((200, blocks) if block_dim == 1 else (2, blocks))
    b0 = 0
    for r0, r1 in _groups(splits):
        d, sc = ops.fp8_block_quantize(x[r0:r1], *args)
        cd, csc = ops.fp8_block_quantize(x[r0:r1].t().contiguous(), *args)
        nb = -(-(r1 - r0) // 128)
        assert torch.equal(data[r0:r1], d) and torch.equal(cdata[:, r0:r1], cd)
        assert torch.equal(scale[r0:r1] if block_dim == 1 else scale[b0:b0 + nb], sc)
        assert torch.equal(cscale[:, b0:b0 + nb], csc)
        b0 += nb
    back = ops.grouped_fp8_block_dequantize(data, s, scale, E4M3, block_dim, False,
                                            torch.float32)
    cback = ops.grouped_fp8_block_dequantize(cdata, s, cscale, E4M3, block_dim, True,
                                             torch.float64)
    for r0, r1 in _groups(splits):
        if r1 == r0:
            continue
        torch.testing.assert_close(back[r0:r1].double(), fq_block(x[r0:r1], *args), rtol=0,
                                   atol=0)
        torch.testing.assert_close(cback[:, r0:r1].t(), fq_block_cols(x[r0:r1], *args), rtol=0,
                                   atol=0)


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "columnwise"])
@pytest.mark.parametrize("rht,block_2d,seeded", [(False, False, False), (True, False, True),
                                                 (False, True, False)],
                         ids=["plain", "rht_sr", "2d"])
def test_grouped_nvfp4_quantize_is_the_nvfp4_quantize_of_each_split(columnwise, rht, block_2d,
                                                                    seeded):
    """Each group quantized on its own (its own amax, its own stochastic-rounding seed), as
    nvfp4_quantize gives it for the split (or the split's transpose) alone."""
    splits = [48, 0, 16, 64] if columnwise else [40, 0, 3, 85]
    x = torch.randn(sum(splits), 32) * torch.tensor([1.0, 5.0, 1.0, 0.01]).repeat_interleave(
        torch.tensor(splits), 0, output_size=sum(splits))[:, None]
    s = torch.tensor(splits)
    seeds = torch.tensor([11, 12, 13, 2**40]) if seeded else None
    data, scale, amax = ops.grouped_nvfp4_quantize(x, s, columnwise, rht, block_2d, seeds)
    assert amax.shape == (4,)
    for g, (r0, r1) in enumerate(_groups(splits)):
        part = x[r0:r1].t().contiguous() if columnwise else x[r0:r1]
        d, sc, a = ops.nvfp4_quantize(part, rht, block_2d,
                                      None if seeds is None else seeds[g])
        got = ((data[:, r0 // 2:r1 // 2], scale[:, r0 // 16:r1 // 16]) if columnwise
               else (data[r0:r1], scale[r0:r1]))
        assert torch.equal(got[0], d) and torch.equal(got[1], sc)
        assert torch.equal(amax[g:g + 1], a)
    back = ops.grouped_nvfp4_dequantize(data, s, scale, amax, columnwise, rht, torch.float32)
    for g, (r0, r1) in enumerate(_groups(splits)):
        got = back[:, r0:r1] if columnwise else back[r0:r1]
        part_shape = (32, r1 - r0) if columnwise else (r1 - r0, 32)
        if r1 == r0:
            continue
        d, sc, a = ops.nvfp4_quantize(x[r0:r1].t().contiguous() if columnwise else x[r0:r1],
                                      rht, block_2d, None if seeds is None else seeds[g])
        assert got.shape == part_shape
        assert torch.equal(got, ops.nvfp4_dequantize(d, sc, a, rht, torch.float32))


def test_grouped_nvfp4_and_block_quantize_errors():
    x = torch.randn(64, 32)
    with pytest.raises(ValueError, match=r"grouped_nvfp4_quantize: split_sizes\[1\] is 20; "
                                           r".*multiple of 16"):
        ops.grouped_nvfp4_quantize(x, torch.tensor([16, 20, 28]), True, False, False, None)
    ops.grouped_nvfp4_quantize(x, torch.tensor([16, 20, 28]), False, False, False, None)
    with pytest.raises(RuntimeError, match=r"grouped_nvfp4_quantize: .*last dimension must be a "
                                             "multiple of 16"):
        ops.grouped_nvfp4_quantize(torch.randn(64, 24), torch.tensor([64]), False, False, False,
                                   None)
    with pytest.raises(RuntimeError, match=r"sr_seeds must have shape \[3\]"):
        ops.grouped_nvfp4_quantize(x, torch.tensor([16, 16, 32]), False, False, False,
                                   torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match=r"grouped_fp8_block_quantize: split_sizes sum to 60 "
                                             "but input has 64 rows"):
        ops.grouped_fp8_block_quantize(x, torch.tensor([30, 30]), E4M3, 1, False, 0.0, False)
    data, scale = ops.grouped_fp8_block_quantize(x, torch.tensor([30, 34]), E4M3, 2, False, 0.0,
                                                 True)
    with pytest.raises(RuntimeError, match=r"grouped_fp8_block_dequantize: scale_inv must have "
                                             r"shape \[1, 2\]"):
        ops.grouped_fp8_block_dequantize(data, torch.tensor([30, 34]), scale[:, :1], E4M3, 2,
                                         True, torch.float32)


def test_nvfp4_splits_not_multiples_of_16_are_a_clear_error_in_training_only():
    """TransformerEngine pads each expert's tokens for NVFP4 (its alignment for the recipe is
    128 rows, a GPU kernel's); the format itself needs 16 rows per block of the columnwise
    copy, which wgrad multiplies, so training refuses other splits and inference takes any.
    The features must be multiples of 16 (blocks along them), the error naming the op."""
    recipe = te.recipe.NVFP4BlockScaling()
    op = te.ops.GroupedLinear(2, 64, 32)
    x = torch.randn(64, 64, requires_grad=True)
    with te.autocast(recipe=recipe):
        with pytest.raises(ValueError, match=r"split_sizes\[0\] is 20; .*multiple of 16"):
            op(x, torch.tensor([20, 44]))
        with torch.no_grad():  # no wgrad, no columnwise copy: any split
            y = op(x, torch.tensor([20, 44]))
    assert y.shape == (64, 32)
    narrow = te.ops.GroupedLinear(2, 40, 32)
    with pytest.raises(ValueError, match=r"GroupedLinear: NVFP4 needs the last dimension to be a "
                                           r"multiple of 16 .*\(32, 40\)"):
        with te.autocast(recipe=recipe):
            narrow(torch.randn(32, 40), torch.tensor([16, 16]))


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8CurrentScaling,
                                        te.recipe.Float8BlockScaling,
                                        te.recipe.NVFP4BlockScaling])
def test_every_group_gets_an_input_and_a_weight_quantizer(recipe_cls):
    """GroupedLinear's forward quantizers alternate input (2g) and weight (2g + 1), as
    TransformerEngine declares them with QuantizerRole; the recipes' input / weight / output
    cycle of three must not decide them (group 1's weight would be index 3, an input's)."""
    if recipe_cls is te.recipe.Float8CurrentScaling:
        recipe = recipe_cls(fp8_quant_fwd_inp=te.recipe.QParams(amax_epsilon=0.5),
                            fp8_quant_fwd_weight=te.recipe.QParams(amax_epsilon=0.25))
    else:
        recipe = recipe_cls()
    op = te.ops.GroupedLinear(4, 64, 32)
    with te.autocast(recipe=recipe):
        op(torch.randn(64, 64), torch.tensor([16, 16, 16, 16]))
    fwd = [op.get_quantizer("forward", i) for i in range(8)]
    if recipe_cls is te.recipe.Float8CurrentScaling:
        assert [q.amax_epsilon for q in fwd] == [0.5, 0.25] * 4
    elif recipe_cls is te.recipe.Float8BlockScaling:
        assert [q.block_scaling_dim for q in fwd] == [1, 2] * 4
    else:
        assert [(q.with_rht, q.with_2d_quantization) for q in fwd] == [(True, False),
                                                                        (False, True)] * 4
    with te.quantized_model_init(recipe=recipe):
        quantized = te.ops.GroupedLinear(4, 128, 128)
    if recipe_cls is te.recipe.Float8BlockScaling:
        assert all(w._is_2D_scaled for w in quantized.weights())
    elif recipe_cls is te.recipe.NVFP4BlockScaling:
        assert all(w._quantizer.with_2d_quantization for w in quantized.weights())


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


#: the per-group quantize op each recipe's compiled graphs call, and its forward GEMM
COMPILED_OPS = {
    "current": ("grouped_fp8_quantize", "grouped_fp8_linear_fwd"),
    "mxfp8": ("grouped_mxfp8_quantize", "grouped_linear_fwd"),
    "block": ("grouped_fp8_block_quantize", "grouped_linear_fwd"),
    "nvfp4": ("grouped_nvfp4_quantize", "grouped_linear_fwd"),
    "nvfp4_sr": ("grouped_nvfp4_quantize", "grouped_linear_fwd"),
}


@pytest.mark.slow
def test_stochastic_rounding_compiled_with_inductor_equals_eager():
    """NVFP4BlockScaling's stochastic rounding of the grouped gradients: inductor draws the
    per-group seeds (te_cpp.random_seeds) from torch's generator as eager does, one draw per
    quantization, so the gradients are eager's bit for bit."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.GroupedLinear(4, 32, 64), te.ops.GELU())
    x0, dy = torch.randn(128, 32), torch.randn(128, 64)
    grads = eager_and_inductor_grads(model, x0, dy, te.recipe.NVFP4BlockScaling(),
                                     torch.tensor([64, 0, 32, 32]))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("recipe_name", list(COMPILED_OPS))
def test_compiled_equals_eager_under_a_recipe(recipe_name):
    """Bit for bit; with stochastic rounding (nvfp4_sr) the seeds are drawn inside the traced
    graph from torch's generator, so the same torch.manual_seed gives the same draws. The
    compiled backward keeps the quantized bytes and their scales, never a dequantized
    operand."""
    recipe = (te.recipe.NVFP4BlockScaling() if recipe_name == "nvfp4_sr"
              else RECIPES[recipe_name][0]())
    splits = [64, 0, 32, 32] if recipe_name != "block" else [70, 0, 33, 25]
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
    quantize, gemm = (f"te_cpp.{name}.default(" for name in COMPILED_OPS[recipe_name])
    # per-tensor and MXFP8: one call for both copies; block and NVFP4: one per copy
    per_copy = recipe_name.startswith(("block", "nvfp4"))
    assert fw.count(quantize) == (2 if per_copy else 1)
    assert bw.count(quantize) == (2 if per_copy else 1)
    assert fw.count(gemm) == 1
    # the backward saves the quantized bytes and the scales, never a dequantized operand:
    # every saved floating tensor besides the parameters is a scale or amax (block scales:
    # one per 128 elements) or the bias scales' input
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


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
@pytest.mark.parametrize("recipe_name", ["block", "nvfp4"])
def test_block_and_nvfp4_backward_override(recipe_name, override):
    """The forward quantized per group; the backward GEMMs unquantized, on the original
    operands ("high_precision") or the forward's rowwise copies dequantized ("dequantized")."""
    make_recipe, make_emulation, _ = RECIPES[recipe_name]
    recipe = dataclasses.replace(make_recipe(), backward_override=override)
    em = make_emulation(recipe)
    splits = [32, 0, 48]
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(3, 64, 32, bias=False)
    x = torch.randn(80, 64, requires_grad=True)
    dy = torch.randn(80, 32)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor(splits))
    y.backward(dy)
    keep = (lambda t: t.double()) if override == "high_precision" else None
    for g, (r0, r1) in enumerate(_groups(splits)):
        w, xs, dys = op.weights()[g].detach(), x.detach()[r0:r1], dy[r0:r1].double()
        w_ref = keep(w) if keep else em.w_rows(w)
        x_ref = keep(xs) if keep else (em.x_rows(xs) if r1 > r0 else xs.double())
        t = tols(torch.float32)
        if r1 > r0:
            torch.testing.assert_close(y[r0:r1].double(), em.x_rows(xs) @ em.w_rows(w).t(), **t)
        torch.testing.assert_close(x.grad[r0:r1].double(), dys @ w_ref, **t)
        torch.testing.assert_close(op.weights()[g].grad.double(), dys.t() @ x_ref, **t)


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


@pytest.mark.parametrize("recipe_name", ["current", "mxfp8", "block", "nvfp4_sr"])
def test_fused_grouped_mlp_under_a_recipe_equals_the_unfused_ops(recipe_name):
    recipe = (te.recipe.NVFP4BlockScaling() if recipe_name == "nvfp4_sr"
              else RECIPES[recipe_name][0]())
    splits = [32, 64, 0, 32]

    def mlp():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.GroupedLinear(4, 32, 128), te.ops.ScaledSwiGLU(),
                                 te.ops.GroupedLinear(4, 64, 32))

    def step(model):
        torch.manual_seed(2)  # the stochastic-rounding seeds come from torch's generator
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


#: 8 experts' splits of 4096 rows, one expert empty: multiples of the blocks down the rows where
#: the recipe's columnwise copies need them (MXFP8 32, NVFP4 16), ragged for Float8BlockScaling
#: (partial 1x128 blocks and 128x128 tiles at each group's end)
REALISTIC_SPLITS = {
    "current": [512, 1024, 0, 256, 768, 512, 640, 384],
    "mxfp8": [512, 992, 0, 288, 768, 512, 640, 384],
    "block": [500, 1037, 0, 260, 771, 515, 630, 383],
    "nvfp4": [512, 1008, 0, 272, 768, 512, 640, 384],
}


@pytest.mark.parametrize("recipe_name", list(REALISTIC_SPLITS))
def test_a_realistic_step_under_a_recipe(recipe_name):
    """8 experts, 4096 rows (uneven, one expert empty), 1024 -> 1024, bf16: forward, dgrad and
    wgrad against the per-group float64 emulation of the recipe (its RECIPES entry: NVFP4 with
    stochastic rounding off, which the emulation cannot draw; the random Hadamard transform on
    the wgrad operands and 16x16 weight tiles on).

    x, dy and the weights span 8 binades, so that the block layout matters under power-of-two
    block scales (Float8BlockScaling's default, MXFP8's E8M0): a block's small values fall
    into E4M3's subnormals, which the same values in the other copy's blocks may not; with
    plain normal values a wgrad on the rowwise copies would pass. (Over 16 binades the GEMMs'
    fp32 accumulation under cancellation exceeds the bf16 tolerance for every recipe, current
    scaling included, while staying within its error bound.)"""
    make_recipe, make_emulation, _ = RECIPES[recipe_name]
    recipe = make_recipe()
    em = make_emulation(recipe)
    splits = REALISTIC_SPLITS[recipe_name]
    assert sum(splits) == 4096 and splits.count(0) == 1
    assert all(n % ALIGNMENT.get(recipe_name, 1) == 0 for n in splits)
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(8, 1024, 1024, dtype=torch.bfloat16)

    def binades(*shape):
        return torch.exp2(torch.randint(-4, 4, shape).float())

    with torch.no_grad():
        for w in op.weights():
            w.mul_(binades(1024, 1024))
    x = (torch.randn(4096, 1024) * binades(4096, 1024)).to(torch.bfloat16).requires_grad_()
    dy = (torch.randn(4096, 1024) * 0.03 * binades(4096, 1024)).to(torch.bfloat16)
    with te.autocast(recipe=recipe):
        y = op(x, torch.tensor(splits))
    y.backward(dy)
    t = tols(torch.bfloat16)
    xd = x.detach()
    xr, xc = (_per_group(xd, splits, lambda v, _: f(v)) for f in (em.x_rows, em.x_cols))
    dyr, dyc = (_per_group(dy, splits, lambda v, _: f(v)) for f in (em.dy_rows, em.dy_cols))
    for g, (r0, r1) in enumerate(_groups(splits)):
        w = op.weights()[g]
        wd = w.detach()
        torch.testing.assert_close(y[r0:r1].double(), xr[r0:r1] @ em.w_rows(wd).t(), **t)
        torch.testing.assert_close(x.grad[r0:r1].double(), dyr[r0:r1] @ em.w_cols(wd), **t)
        torch.testing.assert_close(w.grad.double(), dyc[r0:r1].t() @ xc[r0:r1], **t)


@pytest.mark.parametrize("recipe_name", ["block", "nvfp4"])
def test_block_and_nvfp4_quantized_weights_train_compile_and_checkpoint(recipe_name, tmp_path):
    """te.quantized_model_init under Float8BlockScaling / NVFP4BlockScaling keeps each expert's
    weight as a Float8BlockwiseQTensor (128x128 tiles) / NVFP4Tensor (16x16 blocks), both
    copies, as BasicLinear's: the forward equals quantizing the weights per call, an optimizer
    step re-quantizes them in place (both copies), compiled equals eager and a checkpoint
    round trip (torch.load's weights_only default) restores them."""
    from transformer_engine_cpp.quantization.tensor import as_storage

    recipe = RECIPES[recipe_name][0]()
    cls = te.Float8BlockwiseQTensor if recipe_name == "block" else te.NVFP4Tensor
    splits = torch.tensor([32, 0, 64])

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.GroupedLinear(3, 64, 48))

    with te.quantized_model_init(recipe=recipe):
        model = make()
    plain = make()
    op = model[0]
    assert all(type(w) is cls for w in op.weights())
    assert all(w._rowwise_data is not None and w._columnwise_data is not None
               for w in op.weights())
    x = torch.randn(96, 64, requires_grad=True)
    with te.autocast(recipe=recipe):
        y, y_plain = model(x, splits), plain(x, splits)
    assert torch.equal(y, y_plain)
    y.sum().backward()
    w = op.weights()[2]
    before, grad, quantizer = w.dequantize().detach().clone(), w.grad.clone(), w._quantizer
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    w = op.weights()[2]
    assert type(w) is cls  # re-quantized in place, both copies
    fresh = quantizer.quantize_storage(before.clone().add_(grad, alpha=-0.1), rowwise=True,
                                       columnwise=True)
    assert torch.equal(w.dequantize(), fresh.dequantize_rowwise())
    assert torch.equal(as_storage(w).dequantize_columnwise(), fresh.dequantize_columnwise())
    assert not torch.equal(w.dequantize(), before)
    check_quantized_weights_compile_checkpoint_cast(
        model, make, recipe, x, tmp_path, cls, inputs=(x, splits),
        weight_of=lambda m: m[0].weights()[2])


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8CurrentScaling,
                                        te.recipe.MXFP8BlockScaling,
                                        te.recipe.Float8BlockScaling,
                                        te.recipe.NVFP4BlockScaling],
                         ids=["current", "mxfp8", "block", "nvfp4"])
@pytest.mark.parametrize("grouped", [True, False], ids=["GroupedLinear", "Linear"])
def test_quantized_weights_compiled_before_any_eager_call(grouped, recipe_cls):
    """The first call compiled: the plan (and the binding of each quantized weight to the op's
    weight quantizer, as TransformerEngine re-points a quantized weight's quantizer for every
    recipe) is built while torch.compile traces; the result equals eager and the weights are
    bound."""
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


@pytest.mark.parametrize("grouped", [True, False], ids=["GroupedLinear", "Linear"])
def test_block_weight_keeps_its_quantizer_under_a_recipe_of_other_blocks(grouped):
    """A Float8BlockwiseQTensor weight made in 128x128 tiles, run under a recipe whose weight
    quantizer makes 1x128 blocks, keeps the quantizer it was made with (the op's would write
    scales of another shape into its buffers): an optimizer step re-quantizes it in its own
    tiles."""
    with te.quantized_model_init(recipe=te.recipe.Float8BlockScaling()):
        model = te.ops.Sequential(te.ops.GroupedLinear(2, 128, 128) if grouped
                                  else te.ops.Linear(128, 128))
    op = model[0] if grouped else model[0].basic_ops[0]
    weights = op.weights() if grouped else [op.weight]
    inits = [w._quantizer for w in weights]
    scale_shapes = [w._rowwise_scale_inv.shape for w in weights]
    x = torch.randn(64, 128)
    with te.autocast(recipe=te.recipe.Float8BlockScaling(w_block_scaling_dim=1)):
        y = model(x, torch.tensor([32, 32])) if grouped else model(x)
    assert op.get_quantizer("forward", 1).block_scaling_dim == 1
    y.sum().backward()
    before = [(w.dequantize().detach().clone(), w.grad.clone()) for w in weights]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    weights = op.weights() if grouped else [op.weight]
    for w, q, shape, (b, g) in zip(weights, inits, scale_shapes, before):
        assert w._quantizer is q and w._is_2D_scaled and w._rowwise_scale_inv.shape == shape
        fresh = q.quantize_storage(b.clone().add_(g, alpha=-0.1), rowwise=True, columnwise=True)
        assert torch.equal(w.dequantize(), fresh.dequantize_rowwise())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("recipe_name", ["current", "mxfp8", "block", "nvfp4"])
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


@pytest.mark.parametrize("recipe_cls, in_features, splits, message", [
    (te.recipe.MXFP8BlockScaling, 16, [16, 16], r"GroupedLinear: MXFP8 needs the last dimension"),
    (te.recipe.MXFP8BlockScaling, 32, [0, 1, 0], r"GroupedLinear: columnwise usage needs the "
                                                 r"number of rows \(product of the leading "
                                                 r"dims, 1\)"),
    (te.recipe.NVFP4BlockScaling, 24, [16, 16], r"GroupedLinear: NVFP4 needs the last dimension"),
    (te.recipe.NVFP4BlockScaling, 32, [0, 1, 0], r"GroupedLinear: columnwise usage needs the "
                                                 r"number of rows \(product of the leading "
                                                 r"dims, 1\)"),
])
def test_grouped_linear_refuses_shapes_its_recipe_cannot_quantize(recipe_cls, in_features,
                                                                   splits, message):
    """As BasicLinear: a ValueError naming GroupedLinear and the shape, before the quantize
    ops (whose own checks name them and, for the shape, raise RuntimeError)."""
    op = te.ops.GroupedLinear(len(splits), in_features, 32)
    x = torch.randn(sum(splits), in_features)
    with pytest.raises(ValueError, match=message), te.autocast(recipe=recipe_cls()):
        op(x, torch.tensor(splits))
