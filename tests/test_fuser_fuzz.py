"""Random compositions of te.ops against float64 plain PyTorch. The conformance cases test each
op and each fusion on its own; here seeded draws combine them: one to five ops (norms, linears,
bias, the activations, gated ones that halve the width, scales), in fp32, bf16 or fp16, with a
residual around them (in place or not), frozen parameters, an input that needs no gradient,
zero-row, multi-dimensional and non-contiguous inputs, under grad mode, no_grad and
inference_mode; then the same model called again after its state changed (a parameter frozen or
thawed, another dtype, parameters rescaled in place, another grad mode or input); compiled,
through torch.utils.checkpoint, and under a quantization recipe with Quantize ops among them.
Random expert MLPs (the fused GroupedMLP) are drawn the same way.

Each output and gradient is compared with a float64 run of the plain references
(``testing/reference.py``). The bound is norm-wise: the largest error may reach the dtype's
tolerance (``tolerances.py``) of the largest reference value plus twice the largest error of
the same plain chain run in the model's dtype, each op computed in fp32 and rounded to the
dtype at its output (the rounding any implementation pays between ops), since a chain can
amplify rounding: a norm over two features after two gated activations does (plain fp32 is
1e-3 off there). The compiled draws must equal eager exactly (``COMPILED_VS_EAGER``). Under a
recipe the bound adds the recipe's error per quantizing op (``RECIPE_ERROR_FACTOR``), and a
shape the recipe cannot quantize must be refused by a ValueError naming the op.
"""

from __future__ import annotations

import math
import random
import re

import pytest
import torch
import torch.nn.functional as F

import transformer_engine_cpp as te
from transformer_engine_cpp.testing import reference as ref

from harness import dequantized, make_input
from tolerances import COMPILED_VS_EAGER, tols

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad,
              "inference": torch.inference_mode}
UNARY = {"GELU": ref.gelu, "ReLU": ref.relu, "SiLU": ref.silu, "QGELU": ref.qgelu,
         "SReLU": ref.srelu}
GATED = {"SwiGLU": ref.swiglu, "GEGLU": ref.geglu, "ReGLU": ref.reglu}
KINDS = ("LayerNorm", "RMSNorm", "Linear", "BasicLinear", "Bias", *UNARY, *GATED,
         "ConstantScale", "Identity")


def _draw_op(kind: str, width: int, dtype, rng: random.Random, outs=(8, 16, 24, 32)):
    """(te op, reference(x, params) in x's dtype, output width); ``outs``: a linear's output
    widths."""
    if kind in ("LayerNorm", "RMSNorm"):
        zc = rng.random() < 0.3
        op = getattr(te.ops, kind)(width, dtype=dtype, zero_centered_gamma=zc)
        with torch.no_grad():
            for p in op.parameters():
                p.normal_(0.0 if zc or p is getattr(op, "bias", None) else 1.0, 0.3)
        if kind == "LayerNorm":
            return op, lambda x, p: ref.layer_norm(x, p[0], p[1], 1e-5, zc), width
        return op, lambda x, p: ref.rms_norm(x, p[0], 1e-5, zc), width
    if kind in ("Linear", "BasicLinear"):
        out = rng.choice(outs)
        bias = kind == "Linear" and rng.random() < 0.6
        op = (te.ops.Linear(width, out, bias=bias, dtype=dtype) if kind == "Linear"
              else te.ops.BasicLinear(width, out, dtype=dtype))
        if bias:  # (initialised to zeros, which would hide a bias that is not added)
            with torch.no_grad():
                op.bias.normal_()
        return op, lambda x, p: F.linear(x, p[0], p[1] if bias else None), out
    if kind == "Bias":
        op = te.ops.Bias(width, dtype=dtype)
        with torch.no_grad():
            op.bias.normal_()
        return op, lambda x, p: ref.bias(x, p[0]), width
    if kind in UNARY:
        return getattr(te.ops, kind)(), lambda x, p: UNARY[kind](x), width
    if kind in GATED:
        return getattr(te.ops, kind)(), lambda x, p: GATED[kind](x), width // 2
    if kind == "Quantize":  # the identity outside a recipe; the quantization's error inside
        forward, backward = rng.choice(((True, False), (False, True), (True, True)))
        return te.ops.Quantize(forward=forward, backward=backward), lambda x, p: x, width
    if kind == "ConstantScale":
        scale = rng.choice((0.5, -2.0, 3.0))
        return te.ops.ConstantScale(scale), lambda x, p: ref.constant_scale(x, scale), width
    return te.ops.Identity(), lambda x, p: x, width


class Draw:
    """A seeded model: its ops, their references and whether a residual wraps them."""

    def __init__(self, seed: int, dtypes=DTYPES, kinds=KINDS, widths=(8, 16, 32),
                 outs=(8, 16, 24, 32)):
        self.rng = rng = random.Random(seed)
        torch.manual_seed(seed)
        self.dtype = rng.choice(dtypes)
        self.width = rng.choice(widths)
        ops, self.refs, w = [], [], self.width
        for _ in range(rng.randint(1, 5)):
            kind = rng.choice(kinds)
            if kind in GATED and w % 2:
                kind = "GELU"
            op, fn, w = _draw_op(kind, w, self.dtype, rng, outs)
            ops.append(op)
            self.refs.append((fn, list(op.parameters())))
        self.ops = ops
        self.residual = w == self.width and rng.random() < 0.25
        self.in_place = False  # an in-place residual: its join writes into the input
        if self.residual:
            in_place = self.in_place = rng.random() < 0.5
            fork = te.ops.MakeExtraOutput(in_place=in_place).set_extra_output_channel(
                0, "res", output_to_caller=False)
            join = te.ops.AddExtraInput(in_place=in_place).set_extra_input_channel(0, "res")
            self.model = te.ops.Sequential(fork, *ops, join)
        else:
            self.model = te.ops.Sequential(*ops)
        for p in self.model.parameters():
            if rng.random() < 0.25:
                p.requires_grad_(False)

    def input(self, lead, requires_grad: bool, non_contiguous: bool):
        # (an empty tensor's strided view is contiguous: make_input would reject it)
        return make_input(lead, (self.width,), self.dtype, requires_grad=requires_grad,
                          non_contiguous=non_contiguous and math.prod(lead) > 0)

    def reference(self, x, exact: bool):
        """The plain chain on copies of x and the parameters (requires_grad as theirs):
        (output, [x copy, parameter copies]). ``exact``: in float64; else in the model's dtype
        with each op computed in fp32 and its output rounded to the dtype (the rounding at op
        boundaries that any implementation of the chain in that dtype pays)."""
        dtype = torch.float64 if exact else self.dtype
        work = torch.float64 if exact else torch.float32
        x = x.detach().clone().to(dtype).requires_grad_(x.requires_grad)
        leaves = [x]
        h = x
        for fn, params in self.refs:
            copies = [p.detach().clone().to(dtype).requires_grad_(p.requires_grad)
                      for p in params]
            leaves += copies
            h = fn(h.to(work), [c.to(work) for c in copies]).to(dtype)
        if self.residual:
            h = (h.to(work) + x.to(work)).to(dtype)
        return h, leaves

    def describe(self) -> str:
        names = [type(op).__name__ for op in self.ops]
        return (f"{self.dtype} width {self.width} {names} residual {self.residual} frozen "
                f"{[not p.requires_grad for p in self.model.parameters()]}")


def _assert_close_to_reference(what: str, got, exact, plain, dtype) -> None:
    """max |got - exact| <= rtol max |exact| + atol + 2 max |plain - exact| (norm-wise; plain:
    the chain rounded at op boundaries)."""
    assert got.shape == exact.shape, f"{what}: shape {tuple(got.shape)} != {tuple(exact.shape)}"
    if exact.numel() == 0:
        return
    tol = tols(dtype)
    exact = exact.double()
    err = (got.double() - exact).abs().max().item()
    plain_err = (plain.double() - exact).abs().max().item()
    bound = tol["rtol"] * exact.abs().max().item() + tol["atol"] + 2 * plain_err
    assert err <= bound, f"{what}: error {err:.3g} above {bound:.3g} (plain's {plain_err:.3g})"


def _compare_grads(wants, grads, dy, exact, exact_leaves, plain, plain_leaves, check) -> None:
    """``check(i, got, exact_grad, plain_grad)`` for each gradient of leaf ``i`` in ``wants``
    against those of the float64 chain and the plain chain (zeros where a chain does not
    reach the leaf)."""
    exact_grads = torch.autograd.grad(exact, [exact_leaves[i] for i in wants], dy.double(),
                                      allow_unused=True)
    plain_grads = torch.autograd.grad(plain, [plain_leaves[i] for i in wants],
                                      dy.to(plain.dtype), allow_unused=True)
    for i, g, e, p in zip(wants, grads, exact_grads, plain_grads):
        shape = exact_leaves[i].shape
        check(i, g, torch.zeros(shape, dtype=torch.float64) if e is None else e,
              torch.zeros(shape, dtype=plain.dtype) if p is None else p)


def _check_call(draw: Draw, runner, x, mode: str, context: str) -> None:
    """``_compare``, its failures prefixed with ``context`` and the draw."""
    try:
        _compare(draw, runner, x, mode)
    except AssertionError as e:
        raise AssertionError(f"{context}: {draw.describe()}, input {tuple(x.shape)} "
                             f"requires_grad {x.requires_grad}, {mode}: {e}") from None


def _compare(draw: Draw, runner, x, mode: str) -> None:
    """One call of ``runner`` (the model, eager or compiled) against the references, which
    read x as it was before the call (an eager in-place residual writes the output into the
    caller's input, as in TransformerEngine)."""
    exact, exact_leaves = draw.reference(x, exact=True)
    plain, plain_leaves = draw.reference(x, exact=False)
    with GRAD_MODES[mode]():
        y = runner(x)
    assert y.dtype == draw.dtype, f"output dtype {y.dtype}"
    _assert_close_to_reference("output", y.detach(), exact.detach(), plain.detach(), draw.dtype)
    leaves = [x, *[p for _, params in draw.refs for p in params]]
    wants = [i for i, t in enumerate(leaves) if t.requires_grad]
    if mode != "grad":
        identity = all(type(op) is te.ops.Identity for op in draw.ops) and not draw.residual
        # an all-Identity model returns its input, as nn.Identity does
        assert not y.requires_grad or identity, f"output requires grad under {mode}"
        return
    assert y.requires_grad == bool(wants), (
        f"output requires_grad {y.requires_grad} with {len(wants)} leaves needing a gradient")
    if not wants:
        return
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [leaves[i] for i in wants], dy)

    def check(i, g, e, p):
        assert g.dtype == leaves[i].dtype, f"grad {i}: dtype {g.dtype} != {leaves[i].dtype}"
        _assert_close_to_reference(f"grad of leaf {i}", g, e, p, draw.dtype)

    _compare_grads(wants, grads, dy, exact, exact_leaves, plain, plain_leaves, check)


LEADS = ((5,), (3, 4), (1,), (0,), (2, 0, 3))


@pytest.mark.parametrize("seed", range(150))
def test_random_composition_matches_the_reference(seed):
    draw = Draw(seed)
    rng = draw.rng
    x = draw.input(rng.choice(LEADS), rng.random() < 0.7, rng.random() < 0.3)
    mode = rng.choice(("grad", "grad", "grad", "no_grad", "inference"))
    _check_call(draw, draw.model, x, mode, f"seed {seed}")


@pytest.mark.parametrize("seed", range(40))
def test_random_composition_called_again_after_its_state_changed(seed):
    draw = Draw(1000 + seed, dtypes=(torch.float32, torch.bfloat16))
    rng = draw.rng
    lead, requires_grad, mode, changes = (5,), rng.random() < 0.6, "grad", []
    for call in range(5):
        if call:
            change = rng.choice(("freeze", "input grad", "mode", "dtype", "lead", "rescale"))
            params = list(draw.model.parameters())
            if change == "freeze" and params:
                p = rng.choice(params)
                p.requires_grad_(not p.requires_grad)
            elif change == "input grad":
                requires_grad = not requires_grad
            elif change == "mode":
                mode = rng.choice(tuple(GRAD_MODES))
            elif change == "dtype":
                draw.dtype = torch.bfloat16 if draw.dtype == torch.float32 else torch.float32
                draw.model.to(draw.dtype)
            elif change == "lead":
                lead = rng.choice(LEADS)
            elif change == "rescale" and params:
                with torch.no_grad():
                    rng.choice(params).mul_(-0.5)
            changes.append(change)
        _check_call(draw, draw.model, draw.input(lead, requires_grad, False), mode,
                    f"seed {seed}, call {call} after {changes}")


@pytest.mark.parametrize("seed", range(12))
def test_random_composition_compiled_equals_eager(seed):
    draw = Draw(2000 + seed)
    rng = draw.rng
    x = draw.input(rng.choice(LEADS[:3]), rng.random() < 0.7, rng.random() < 0.3)
    compiled = torch.compile(draw.model, fullgraph=True)
    wants = [t for t in [x, *draw.model.parameters()] if t.requires_grad]
    y = compiled(x)
    y_eager = draw.model(x)
    torch.testing.assert_close(y, y_eager, **COMPILED_VS_EAGER)
    if wants:
        dy = torch.randn_like(y)
        for g, g_eager in zip(torch.autograd.grad(y, wants, dy),
                              torch.autograd.grad(y_eager, wants, dy)):
            torch.testing.assert_close(g, g_eager, **COMPILED_VS_EAGER)
    _check_call(draw, compiled, x, "grad", f"seed {seed}, compiled")


@pytest.mark.parametrize("seed", range(24))
def test_random_composition_checkpointed_equals_the_plain_step(seed):
    """Through torch.utils.checkpoint (reentrant or not) a draw's outputs and gradients are the
    un-checkpointed step's bit for bit; an in-place residual, whose forward writes into the
    checkpointed function's input, is refused with a RuntimeError instead (by torch's version
    check, or by the fuser under the reentrant checkpoint)."""
    from torch.utils.checkpoint import checkpoint

    draw = Draw(3000 + seed)
    rng = draw.rng
    reentrant = rng.random() < 0.5
    base = draw.input(rng.choice(LEADS[:3]), True, False).detach()
    params = list(draw.model.parameters())
    dy = torch.randn(*base.shape[:-1], draw.model(base.clone()).shape[-1]).to(draw.dtype)

    def step(ckpt):
        x = base.clone().requires_grad_()
        y = checkpoint(draw.model, x, use_reentrant=reentrant) if ckpt else draw.model(x)
        y.backward(dy)
        grads = [x.grad, *[p.grad for p in params]]
        draw.model.zero_grad(set_to_none=True)
        return [y.detach(), *grads]

    reference = step(False)
    if draw.in_place:
        with pytest.raises(RuntimeError):
            step(True)
        return
    for got, expected in zip(step(True), reference, strict=True):
        torch.testing.assert_close(got, expected, **COMPILED_VS_EAGER,
                                   msg=lambda m: f"seed {3000 + seed}: {draw.describe()}: {m}")


RECIPES = {"current": te.recipe.Float8CurrentScaling, "delayed": te.recipe.DelayedScaling,
           "block": te.recipe.Float8BlockScaling, "mxfp8": te.recipe.MXFP8BlockScaling,
           "nvfp4": te.recipe.NVFP4BlockScaling}
#: the ops that quantize under a recipe (a linear's GEMM operands, a Quantize's tensor)
QUANTIZING = (te.ops.Linear, te.ops.BasicLinear, te.ops.Quantize)
#: the ops after which a quantization error counts twice: a gated activation multiplies two
#: halves that both carry it, SReLU squares it
DOUBLING = (*(getattr(te.ops, name) for name in GATED), te.ops.SReLU)
#: A draw under a recipe: its norm-wise error at most this many times the recipe's per-GEMM
#: error (QUANTIZED_RELATIVE_ERROR) times the reference's norm, summed over its quantizing ops,
#: each doubled for every DOUBLING op after it, plus twice the plain chain's own error and
#: the dtype's tolerance. Over 3000 draws (5205 outputs and gradients) the largest ratio to
#: that sum was 1.94: NVFP4, bf16, a linear then ReLU, QGELU, GEGLU and LayerNorm, the bias'
#: gradient, all of it the linear's quantization (the rest of the chain in float64 from the
#: linear's quantized output gives the same gradient within 0.6%).
RECIPE_ERROR_FACTOR = 3.0


def _recipe_draw(seed: int) -> Draw:
    """A draw with Quantize ops among its kinds, at widths a recipe can quantize."""
    return Draw(seed, kinds=(*KINDS, "Quantize"), widths=(16, 32, 64), outs=(16, 32, 64))


def _assert_within_recipe_error(what: str, got, exact, plain, draw: Draw, per_op: float):
    exact = exact.double()
    points = max(1, sum(2 ** sum(isinstance(later, DOUBLING) for later in draw.ops[i + 1:])
                        for i, op in enumerate(draw.ops) if isinstance(op, QUANTIZING)))
    tol = tols(draw.dtype)
    norm = exact.norm().item()
    plain_err = (plain.double() - exact).norm().item()
    bound = RECIPE_ERROR_FACTOR * (points * per_op * norm + 2 * plain_err + tol["rtol"] * norm
                                   + tol["atol"] * math.sqrt(exact.numel()))
    err = (got.double() - exact).norm().item()
    assert err <= bound or not math.isfinite(bound), (
        f"{what}: norm-wise error {err:.3g} above {bound:.3g}")


@pytest.mark.parametrize("seed", range(80))
def test_random_composition_under_a_recipe(seed):
    """Under a random recipe, with Quantize ops among the draws: a draw runs, or its op that
    quantizes refuses a shape the recipe cannot quantize with a ValueError naming it; its
    output and gradients stay within the recipe's error of the float64 reference."""
    from tolerances import QUANTIZED_RELATIVE_ERROR

    draw = _recipe_draw(4000 + seed)
    rng = draw.rng
    recipe_cls = RECIPES[rng.choice(sorted(RECIPES))]
    per_op = QUANTIZED_RELATIVE_ERROR[recipe_cls.__name__]
    x = draw.input(rng.choice(((32,), (2, 16), (5,), (0,))), rng.random() < 0.7,
                   rng.random() < 0.3)
    context = f"seed {4000 + seed}, {recipe_cls.__name__}: {draw.describe()}"
    exact, exact_leaves = draw.reference(x, exact=True)
    plain, plain_leaves = draw.reference(x, exact=False)
    leaves = [x, *[p for _, params in draw.refs for p in params]]
    wants = [i for i, t in enumerate(leaves) if t.requires_grad]
    try:
        with te.autocast(recipe=recipe_cls()):
            y = draw.model(x)
        dy = torch.randn(y.shape, dtype=draw.dtype)
        grads = torch.autograd.grad(y, [leaves[i] for i in wants], dy) if wants else []
    except ValueError as e:
        assert re.match(r"(BasicLinear|Quantize): ", str(e)), f"{context}: {e}"
        return
    if exact.numel() == 0:
        return
    _assert_within_recipe_error(f"{context}: output", dequantized(y).detach(), exact.detach(),
                                plain.detach(), draw, per_op["forward"])
    if not wants:
        return
    _compare_grads(wants, grads, dy, exact, exact_leaves, plain, plain_leaves,
                   lambda i, g, e, p: _assert_within_recipe_error(
                       f"{context}: grad of leaf {i}", dequantized(g), e, p, draw,
                       per_op["backward"]))


SCALED_ACTS = {"ScaledSwiGLU": ref.scaled_swiglu, "ScaledSReLU": ref.scaled_srelu,
               "ScaledClampedQGeGLU": ref.scaled_clamped_qgeglu}


def _grouped_linear_reference(x, splits, weights, biases):
    outs, row = [], 0
    for g, n in enumerate(splits):
        y = F.linear(x[row:row + n], weights[g])
        outs.append(y + biases[g] if biases else y)
        row += n
    return torch.cat(outs)


@pytest.mark.parametrize("seed", range(40))
def test_random_grouped_mlp_matches_the_reference(seed):
    """Random expert MLPs (GroupedLinear, a scaled activation, GroupedLinear: the fused
    GroupedMLP): 1 to 4 experts, random splits (empty ones included), biases or not, frozen
    parameters, an input and scales with or without grad, the activation recomputed or not,
    grad mode, no_grad or inference_mode, against float64 per expert, within the bound of the
    other draws (the chain rounded at op boundaries)."""
    rng = random.Random(5000 + seed)
    torch.manual_seed(5000 + seed)
    groups, hidden, ffn = rng.choice((1, 2, 3, 4)), rng.choice((16, 32)), rng.choice((16, 32))
    dtype = rng.choice(DTYPES)
    act_name = rng.choice(sorted(SCALED_ACTS))
    act_cls = getattr(te.ops, act_name)
    act = (act_cls(activation_recompute_in_mlp=True)
           if act_name == "ScaledSReLU" and rng.random() < 0.5 else act_cls())
    biases = rng.random() < 0.5, rng.random() < 0.5
    fc1 = te.ops.GroupedLinear(groups, hidden, 2 * ffn if act.gated else ffn, bias=biases[0],
                               dtype=dtype)
    fc2 = te.ops.GroupedLinear(groups, ffn, hidden, bias=biases[1], dtype=dtype)
    model = te.ops.Sequential(fc1, act, fc2)
    with torch.no_grad():
        for b in [*fc1.biases(), *fc2.biases()]:
            b.uniform_(-1, 1)
    for p in model.parameters():
        p.requires_grad_(rng.random() >= 0.25)
    rows = rng.choice((0, 1, 7, 24))
    cuts = sorted(rng.randint(0, rows) for _ in range(groups - 1))
    splits = [b - a for a, b in zip([0, *cuts], [*cuts, rows])]
    x = torch.randn(rows, hidden).to(dtype).requires_grad_(rng.random() < 0.7)
    scales = torch.rand(rows).to(dtype).requires_grad_(rng.random() < 0.5)
    mode = rng.choice(("grad", "grad", "no_grad", "inference"))
    context = (f"seed {5000 + seed}: {groups} experts, {act_name} (recompute "
               f"{act.activation_recompute_in_mlp}), {dtype}, biases {biases}, splits {splits}, "
               f"x / scales grad {x.requires_grad} / {scales.requires_grad}, frozen "
               f"{[not p.requires_grad for p in model.parameters()]}, {mode}")
    split_t = torch.tensor(splits)
    with GRAD_MODES[mode]():
        y = model(x, split_t, scales, split_t)
    leaves = [x, scales, *model.parameters()]

    def reference(exact: bool):
        dtype_ = torch.float64 if exact else dtype
        work = torch.float64 if exact else torch.float32
        copies = [t.detach().clone().to(dtype_).requires_grad_(t.requires_grad) for t in leaves]
        w = [c.to(work) for c in copies]
        n1 = groups * (2 if biases[0] else 1)
        fc1_w, fc1_b = w[2:2 + groups], w[2 + groups:2 + n1] if biases[0] else []
        fc2_w = w[2 + n1:2 + n1 + groups]
        fc2_b = w[2 + n1 + groups:] if biases[1] else []
        h = _grouped_linear_reference(w[0], splits, fc1_w, fc1_b).to(dtype_).to(work)
        a = SCALED_ACTS[act_name](h, w[1]).to(dtype_).to(work)
        return _grouped_linear_reference(a, splits, fc2_w, fc2_b).to(dtype_), copies

    exact, exact_leaves = reference(True)
    plain, plain_leaves = reference(False)
    _assert_close_to_reference(f"{context}: output", y.detach(), exact.detach(),
                               plain.detach(), dtype)
    wants = [i for i, t in enumerate(leaves) if t.requires_grad]
    if mode != "grad" or not wants:
        assert not (mode != "grad" and y.requires_grad), f"{context}: output requires grad"
        return
    dy = torch.randn(y.shape).to(dtype)
    grads = torch.autograd.grad(y, [leaves[i] for i in wants], dy)
    _compare_grads(wants, grads, dy, exact, exact_leaves, plain, plain_leaves,
                   lambda i, g, e, p: _assert_close_to_reference(
                       f"{context}: grad of leaf {i}", g, e, p, dtype))
