"""Quantized compute in the ops (te.autocast with an FP8 recipe): BasicLinear's FP8 GEMMs
against an independent emulation (the references of test_fp8_quantize.py), the Quantize op,
recipe-driven plans, DelayedScaling in eager and refused under compile, the pre-norm MLP
block compiled with fullgraph=True under Float8CurrentScaling and MXFP8BlockScaling (fp32, and
bf16 with the bfloat16 fp8_gemm strategy), every conformance case under each recipe (fp32,
bf16 and fp16 models), and the cases with a GEMM under each recipe with frozen weights,
bias-only training, an input without grad and torch.inference_mode, eager and compiled."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._dynamo.utils import counters

import transformer_engine_cpp as te
from transformer_engine_cpp.ops import _quantized
from transformer_engine_cpp.quantization.tensor import as_storage
from transformer_engine_cpp.testing.reference import te_prenorm_mlp
from test_fp8_quantize import E4M3, E5M2, ref_current, ref_dequant, ref_mx_dequant, ref_mxfp8
from harness import as_tuple, copy_nodes, dequantized, eager_and_inductor_grads
from tolerances import COMPILED_VS_EAGER, tols

FP32 = tols(torch.float32)


def fq_current(t, fmt):
    data, scale_inv, _ = ref_current(t, fmt)
    return ref_dequant(data, scale_inv, fmt, torch.float64)


def fq_mx_rows(t, fmt):
    data, scale = ref_mxfp8(t, fmt)
    return ref_mx_dequant(data, scale, fmt, torch.float64)


def fq_mx_cols(t, fmt):
    cols = t.shape[-1]
    return fq_mx_rows(t.reshape(-1, cols).t().contiguous(), fmt).t().reshape(t.shape)


RECIPES = {
    "current": (lambda: te.recipe.Float8CurrentScaling(),
                lambda t, fmt: fq_current(t, fmt), lambda t, fmt: fq_current(t, fmt)),
    "mxfp8": (lambda: te.recipe.MXFP8BlockScaling(), fq_mx_rows, fq_mx_cols),
}


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_basic_linear_fp8_gemms_match_the_emulation(recipe_name):
    make_recipe, fq_rows, fq_cols = RECIPES[recipe_name]
    recipe = make_recipe()
    fwd_fmt = E4M3
    bwd_fmt = E4M3 if recipe.fp8_format == te.recipe.Format.E4M3 else E5M2
    torch.manual_seed(0)
    op = te.ops.BasicLinear(64, 32)
    x = torch.randn(2, 16, 64, requires_grad=True)
    dy = torch.randn(2, 16, 32)
    with te.autocast(recipe=recipe):
        y = op(x)
    y.backward(dy)
    w = op.weight.detach()
    y_ref = fq_rows(x.detach(), fwd_fmt) @ fq_rows(w, fwd_fmt).t()
    dx_ref = fq_rows(dy, bwd_fmt) @ fq_cols(w, fwd_fmt)
    dw_ref = fq_cols(dy, bwd_fmt).reshape(-1, 32).t() @ fq_cols(x.detach(), fwd_fmt).reshape(-1, 64)
    torch.testing.assert_close(y.double(), y_ref, **FP32)
    torch.testing.assert_close(x.grad.double(), dx_ref, **FP32)
    torch.testing.assert_close(op.weight.grad.double(), dw_ref, **FP32)
    # and it is not the unquantized result
    assert not torch.allclose(y, x.detach() @ w.t(), rtol=1e-4, atol=1e-4)


def test_quantized_saved_tensors_are_fp8_buffers():
    op = te.ops.BasicLinear(32, 32)
    x = torch.randn(32, 32, requires_grad=True)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = op(x)
    saved = [t for t in y.grad_fn.saved_tensors if t is not None]
    assert saved and all(t.dtype in (torch.uint8, torch.float32) for t in saved)
    assert sum(t.numel() for t in saved if t.dtype == torch.uint8) == 2 * 32 * 32


def test_quantize_op_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(4, 32, requires_grad=True)
    dy = torch.randn(4, 32)
    op = te.ops.Quantize(forward=True, backward=True)
    assert torch.equal(op(x), x)  # no autocast: identity
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = te.ops.Sequential(op)(x)
    y.backward(dy)
    # TransformerEngine's: a quantized tensor out, a quantized gradient back
    assert isinstance(y, te.Float8Tensor) and isinstance(x.grad, te.Float8Tensor)
    torch.testing.assert_close(y.double(), fq_current(x.detach(), E4M3), rtol=0, atol=0)
    torch.testing.assert_close(x.grad.double(), fq_current(dy, E5M2), rtol=0, atol=0)
    with pytest.raises(TypeError, match="Quantize: forward must be a bool"):
        te.ops.Quantize(forward=1)


def test_quantize_op_hands_the_next_linear_its_quantized_input_and_compiles():
    recipe = te.recipe.MXFP8BlockScaling()
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    dy = torch.randn(32, 64)
    model = te.ops.Sequential(te.ops.Quantize(forward=True, backward=True))
    with te.autocast(recipe=recipe):
        y = model(x)
    y.backward(dy)
    assert isinstance(y, te.MXFP8Tensor) and isinstance(x.grad, te.MXFP8Tensor)
    torch.testing.assert_close(y.double(), fq_mx_rows(x.detach(), E4M3), rtol=0, atol=0)
    # compiled: the same values, dequantized (the caller's gradient is a plain tensor)
    xc = x.detach().clone().requires_grad_()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with te.autocast(recipe=recipe):
        yc = compiled(xc)
    yc.backward(dy)
    assert torch.equal(yc, y.dequantize()) and torch.equal(xc.grad, x.grad.dequantize())
    # Quantize then a linear: the linear's GEMM takes the quantized tensor
    torch.manual_seed(1)
    chain = te.ops.Sequential(te.ops.Quantize(), te.ops.BasicLinear(64, 32))
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        out = chain(x.detach())
    w = chain[1].weight.detach()
    torch.testing.assert_close(out.double(), fq_current(x.detach(), E4M3)
                               @ fq_current(w, E4M3).t(), **FP32)


def test_recipe_selects_and_caches_plans():
    model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU())
    x = torch.randn(4, 32, requires_grad=True)
    model(x)
    fuser = model._module_groups[0]
    assert [type(op).__name__ for op, _ in fuser._forward_ops] == ["ForwardLinearBiasActivation"]
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        model(x)
    assert fuser.recipe_type is te.recipe.Float8CurrentScaling
    assert [type(op).__name__ for op, _ in fuser._forward_ops] == ["BasicLinear", "Bias", "GELU"]
    quantizer = model[0].basic_ops[0].get_quantizer("forward", 0)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        model(x)
    assert model[0].basic_ops[0].get_quantizer("forward", 0) is quantizer  # same recipe: kept
    with te.autocast(recipe=te.recipe.Float8CurrentScaling(use_power_2_scales=True)):
        model(x)
    q2 = model[0].basic_ops[0].get_quantizer("forward", 0)
    assert q2 is not quantizer and q2.force_pow_2_scales  # any recipe change rebuilds
    model(x)
    assert fuser.recipe_type is type(None)


@pytest.mark.parametrize("grad", [True, False], ids=["train", "no_grad"])
def test_no_recipe_after_autocast_computes_unquantized(grad):
    """Outside te.autocast the GEMMs are not quantized, also right after an autocast call
    (the quantizers of the previous recipe are dropped)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(32, 48), te.ops.GELU(), te.ops.Linear(48, 16))
    x = torch.randn(8, 32, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        expected = model(x).detach()
        with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
            quantized = model(x).detach()
        after = model(x).detach()
    assert not torch.equal(quantized, expected)  # FP8 GEMMs do change the result
    torch.testing.assert_close(after, expected, rtol=0, atol=0)
    assert all(op._quantizers is None for op in model[0].basic_ops)


def test_delayed_scaling_eager_updates_scales_and_is_refused_under_compile():
    recipe = te.recipe.DelayedScaling(margin=0, amax_history_len=4)
    op = te.ops.BasicLinear(32, 32)
    x = torch.randn(8, 32) * 3
    with te.autocast(recipe=recipe):
        op(x)
    state = op._fp8_metas["forward"]
    amax_x = x.abs().amax()
    # after the autocast exit: scale = fp8_max / amax (history max), history rolled
    torch.testing.assert_close(state.scale[0], 448.0 / amax_x, rtol=1e-6, atol=0)
    model = te.ops.Sequential(te.ops.BasicLinear(32, 32))
    with pytest.raises(te.ops.CompileUnsupportedError,
                       match="^DelayedScaling cannot be compiled; use Float8CurrentScaling"):
        with te.autocast(recipe=recipe):
            torch.compile(model, backend="aot_eager", fullgraph=True)(
                torch.randn(4, 32, requires_grad=True))


def mlp_block(hidden=64, ffn=128):
    return te_prenorm_mlp(hidden, ffn)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_compiled_fp8_mlp_block_equals_eager(recipe_name):
    make_recipe = RECIPES[recipe_name][0]
    torch.manual_seed(0)
    eager = mlp_block()
    comp_model = copy.deepcopy(eager)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(comp_model, backend=backend, fullgraph=True)
    x = torch.randn(32, 64, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    dy = torch.randn(32, 64)
    with te.autocast(recipe=make_recipe()):
        y = eager(x)
        yc = compiled(xc)
    y.backward(dy)
    yc.backward(dy)
    assert len(counters["graph_break"]) == 0
    torch.testing.assert_close(yc, y, **COMPILED_VS_EAGER)
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    for (n, p), q in zip(comp_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **COMPILED_VS_EAGER, msg=lambda m: f"{n}: {m}")
    quant = "te_cpp.fp8_quantize" if recipe_name == "current" else "te_cpp.mxfp8_quantize"
    assert quant in backend.fw_graphs[0].code and quant in backend.bw_graphs[0].code
    # FP8 crosses the custom ops as plain uint8 buffers: every GEMM, forward and backward, is
    # te_cpp.fp8_gemm / mxfp8_gemm on the buffers themselves, so no dequantized (fp32) copy of
    # an operand is made in the graphs, let alone saved for backward
    gemm = "te_cpp.fp8_gemm" if recipe_name == "current" else "te_cpp.mxfp8_gemm"
    for graph in (backend.fw_graphs[0], backend.bw_graphs[0]):
        nodes = [n for n in graph.graph.nodes
                 if n.op == "call_function" and gemm in str(n.target)]
        assert nodes and all(n.args[0].meta["val"].dtype == torch.uint8 for n in nodes)
        assert "dequantize" not in graph.code
    # two linears: dgrad and wgrad each
    assert sum(gemm in str(n.target) for n in backend.bw_graphs[0].graph.nodes) == 4
    # no copies at all: the column-wise FP8 bytes are te_cpp.transpose_2d's, and an MXFP8
    # column-wise quantization reads the transposed input in place
    for graph in (backend.fw_graphs[0], backend.bw_graphs[0]):
        assert not copy_nodes(graph), graph.code


@pytest.mark.parametrize("make_recipe", [te.recipe.Float8CurrentScaling, te.recipe.MXFP8BlockScaling,
                                         te.recipe.Float8BlockScaling, te.recipe.NVFP4BlockScaling],
                         ids=["current", "mxfp8", "block", "nvfp4"])
def test_compiled_forward_saves_no_more_high_precision_than_eager(make_recipe):
    """Every compilable recipe: the compiled forward (aot_eager's partition) saves for backward
    no high-precision tensor that eager does not, beyond the graph's own inputs (a parameter
    kept for the backward to quantize again costs no memory): the quantized operands cross as
    their uint8 bytes and scales, not as dequantized fp32 copies. Shapes off the MXFP8 GEMM's
    blocks (ffn 160) make the linears' GEMMs dequantize inside the graphs."""
    torch.manual_seed(0)
    eager = te_prenorm_mlp(64, 160)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(copy.deepcopy(eager), backend=backend, fullgraph=True)
    x = torch.randn(2, 64, 64, requires_grad=True)
    with te.autocast(recipe=make_recipe()):
        y = eager(x)
        compiled(x.detach().clone().requires_grad_())

    def high_precision_bytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors if t.is_floating_point())

    saved_eager = [t for t in y.grad_fn.saved_tensors if t is not None]
    fw = backend.fw_graphs[0]
    out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved_compiled = [a.meta["val"] for a in out[1:]
                      if isinstance(a, torch.fx.Node) and a.op != "placeholder"
                      and isinstance(a.meta.get("val"), torch.Tensor)]
    assert any(t.dtype == torch.uint8 for t in saved_compiled)
    assert high_precision_bytes(saved_compiled) <= high_precision_bytes(saved_eager)


@pytest.mark.parametrize("act", ["GELU", "SwiGLU", "ReLU"])
def test_cache_quantized_input(act):
    """The activation computes on, and saves only, the FP8 (current scaling, E4M3) copy of its
    input; its output and gradient equal the plain op's on that quantized input."""
    torch.manual_seed(0)
    x = torch.randn(6, 64, requires_grad=True)
    dy_shape = (6, 32) if act == "SwiGLU" else (6, 64)
    dy = torch.randn(*dy_shape)
    cached = getattr(te.ops, act)(cache_quantized_input=True)
    y = cached(x)
    saved = [t for t in y.grad_fn.saved_tensors if t is not None]
    assert saved[0].dtype == torch.uint8 and saved[0].numel() == x.numel()
    y.backward(dy)
    xq = fq_current(x.detach(), E4M3).float().requires_grad_()
    y_ref = getattr(te.ops, act)()(xq)
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xq.grad, rtol=0, atol=0)


def test_neighbours_hand_over_quantized_tensors():
    """The neighbour protocol: LayerNorm quantizes its output with the next BasicLinear's input
    quantizer and the linear skips its own cast (same values as quantizing in the linear); in
    backward the Bias after the linear hands dy over quantized with the linear's grad-output
    quantizer."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(64), te.ops.Linear(64, 32))
    x = torch.randn(8, 64, requires_grad=True)
    captured = {}
    linear = model[1].basic_ops[0]
    original = linear._quantized_forward

    def spy(ctx, xin, w):
        out = original(ctx, xin, w)
        captured["quantized"] = ctx.input_was_quantized
        return out

    original_bwd = linear._quantized_backward

    def spy_bwd(ctx, grad_output, **kw):
        captured["grad_quantized"] = _quantized.is_storage(grad_output)
        return original_bwd(ctx, grad_output, **kw)

    linear._quantized_forward = spy
    linear._quantized_backward = spy_bwd
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = model(x)
    y.sum().backward()
    assert captured["quantized"] is True
    # backward: the Bias after the linear hands dy over quantized with its grad-output quantizer
    assert captured["grad_quantized"] is True
    ln = model[0]
    h = torch.nn.functional.layer_norm(x.detach(), (64,), ln.weight.detach(), ln.bias.detach())
    y_ref = fq_current(h, E4M3) @ fq_current(linear.weight.detach(), E4M3).t()
    torch.testing.assert_close(y.double(), y_ref + model[1].bias.detach().double(), **FP32)
    assert x.grad is not None and ln.weight.grad is not None


# ---- every conformance case under a recipe ---------------------------------------------------


def _rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _cases():
    from cases import OP_CASES
    return OP_CASES


#: The recipes whose scale blocks must tile both dims of every GEMM operand, by block size
#: (MXFP8: 32, NVFP4: 16). Float8BlockScaling's 1x128 and 128x128 blocks take partial blocks at
#: the edges, so any shape runs under it as under current scaling.
TILING_BLOCK = {te.recipe.MXFP8BlockScaling: 32, te.recipe.NVFP4BlockScaling: 16}
#: the leading dims of the inputs under a tiling recipe: 96 rows, a multiple of either block
TILING_LEAD = (2, 3, 16)
#: (DelayedScaling's single call quantizes with its initial scales, 1)
CONFORMANCE_RECIPES = {"current": te.recipe.Float8CurrentScaling,
                       "delayed": te.recipe.DelayedScaling,
                       "block": te.recipe.Float8BlockScaling,
                       "mxfp8": te.recipe.MXFP8BlockScaling,
                       "nvfp4": te.recipe.NVFP4BlockScaling}


#: the model dtypes every case runs in under each recipe
MODEL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.parametrize("dtype", list(MODEL_DTYPES.values()), ids=list(MODEL_DTYPES))
@pytest.mark.parametrize("recipe_cls", list(CONFORMANCE_RECIPES.values()),
                         ids=list(CONFORMANCE_RECIPES))
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_op_case_under_a_recipe(case, recipe_cls, dtype):
    """Ops without quantizers give bit-identical results under te.autocast; ops with quantized
    GEMMs stay within the recipe's tolerance of the unquantized result in the same dtype
    (fp32, bf16 and fp16 models), forward and backward. Under MXFP8 and NVFP4 a case with a
    GEMM first gets the op's error at its own sizes (not multiples of the block:
    TransformerEngine's quantizers refuse them too), then runs at block-multiple sizes (the
    case's fit_blocks) on 96 rows."""
    from harness import as_tuple, build, clone_leaf, eager_run, inputs_for, random_grads_like
    from tolerances import QUANTIZED_RELATIVE_ERROR

    quantized = any(isinstance(m, te.ops.BasicLinear) for m in build(case, dtype).modules())
    block = TILING_BLOCK.get(recipe_cls)
    lead = None
    if block and quantized:
        seq = build(case, dtype)
        x, extras = inputs_for(case, dtype, "leading_dims")
        with pytest.raises(ValueError, match=rf"BasicLinear: .* multiples? of {block}\b"):
            with te.autocast(recipe=recipe_cls()):
                seq(x, *extras)
        assert case.fit_blocks is not None, f"{case.id}: a case with a GEMM needs fit_blocks"
        case, lead = case.fit_blocks(block), TILING_LEAD
    seq = build(case, dtype)
    x, extras = inputs_for(case, dtype, "leading_dims", lead=lead)
    with torch.no_grad():
        grads = random_grads_like(as_tuple(seq(clone_leaf(x), *[clone_leaf(e) for e in extras])))
    ref = eager_run(seq, clone_leaf(x), [clone_leaf(e) for e in extras], [g.clone() for g in grads])
    seq.zero_grad(set_to_none=True)
    with te.autocast(recipe=recipe_cls()):
        outs = as_tuple(seq(x, *extras))
    torch.autograd.backward(outs, [g.clone() for g in grads])
    got = (outs, x.grad, [e.grad for e in extras], {n: p.grad for n, p in seq.named_parameters()})
    pairs = [(a, b, "forward") for a, b in zip(got[0], ref[0])]
    pairs += [(got[1], ref[1], "backward")] + [(a, b, "backward") for a, b in zip(got[2], ref[2])]
    pairs += [(got[3][n], ref[3][n], "backward") for n in ref[3]]
    tolerance = QUANTIZED_RELATIVE_ERROR[recipe_cls.__name__]
    for a, b, direction in pairs:
        if b is None:
            assert a is None
        elif quantized:
            assert _rel_err(a, b) < tolerance[direction], (direction, _rel_err(a, b))
        else:
            assert torch.equal(a, b)
    if quantized:  # and the recipe did apply
        assert not torch.equal(got[0][0], ref[0][0])


# ---- the easy-to-forget paths of the cases with a GEMM, under each recipe ---------------------


def _has_gemm(case):
    from harness import build
    return any(isinstance(m, te.ops.BasicLinear) for m in build(case, torch.float32).modules())


def _gemm_cases():
    return [c for c in _cases() if _has_gemm(c)]


def _has_bias(case):
    from harness import build
    return any(n.endswith("bias") for n, _ in build(case, torch.float32).named_parameters())


#: frozen_weight: every BasicLinear's weight needs no grad; bias_only: only the biases need
#: grad (not the input, the extra inputs or the weights); input_no_grad: the input needs no
#: grad; inference_mode: the forward under torch.inference_mode
GEMM_PATHS = ["frozen_weight", "bias_only", "input_no_grad", "inference_mode"]


def _gemm_path_params():
    out = []
    for case in _gemm_cases():
        for path in GEMM_PATHS:
            if path == "bias_only" and not _has_bias(case):
                continue  # nothing would need grad
            out.append(pytest.param(case, path, id=f"{case.id}-{path}"))
    return out


def _operand_work(ops):
    """The te_cpp calls among ``ops`` (a trace of _run_path) that make a copy of a GEMM
    operand: a quantize, the transpose of per-tensor FP8 bytes into the column-wise copy, a
    dequantize (the GEMMs the FP8 GEMM ops do not take run on dequantized copies)."""
    return [name for name, _ in ops if "quantize" in name or "transpose_2d" in name]


def _columnwise_copies(run, recipe_cls):
    """Which column-wise (transposed) operand copies the run's te_cpp calls made or read, of
    "x" (the linear's input, [in_features, rows]), "dy" ([out_features, rows]) and "w"
    ([in_features, out_features]; not told from the weight itself when square), found by their
    2-D shapes (NVFP4 packs two values a byte)."""
    rows, k, n = run["sizes"]
    shapes = {"x": (k, rows), "dy": (n, rows), **({"w": (k, n)} if k != n else {})}
    packed = recipe_cls is te.recipe.NVFP4BlockScaling
    found = set()
    for _, seen in run["forward"] + run["backward"]:
        for name, (a, b) in shapes.items():
            if (a, b) in seen or (packed and (a, b // 2) in seen):
                found.add(name)
    return found


def _case_for(case, recipe_cls):
    """The case and its leading dims under ``recipe_cls``: block-multiple sizes on 96 rows
    under the tiling recipes (test_op_case_under_a_recipe)."""
    block = TILING_BLOCK.get(recipe_cls)
    return (case.fit_blocks(block), TILING_LEAD) if block else (case, None)


def _run_path(case, recipe_cls, path, lead, grads, *, quantized, dtype=torch.float32,
              grad_mode=None, model=None):
    """One run of ``case`` on ``path`` (None: full training) under ``recipe_cls`` (or
    unquantized), on a fresh copy of its ops (DelayedScaling's state starts anew): the outputs,
    the grads of the input, extra inputs and parameters (None where not needed), the tensors
    autograd saved and the te_cpp ops called, forward and backward. ``model``: run
    ``model(the case's Sequential)`` instead (its compiled form), not observed (no saved-tensor
    hooks, no trace)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from harness import as_tuple, build, inputs_for

    class Trace(TorchDispatchMode):
        """The te_cpp calls, as (name, the 2-D shapes among their arguments and outputs)."""

        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "te_cpp":
                tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                           if isinstance(t, torch.Tensor)]
                self.ops.append((func.name(), {tuple(t.shape) for t in tensors if t.dim() == 2}))
            return out

    seq = build(case, dtype)
    x, extras = inputs_for(case, dtype, "leading_dims", lead=lead)
    if path in ("frozen_weight", "bias_only"):
        for m in seq.modules():
            if isinstance(m, te.ops.BasicLinear):
                m.weight.requires_grad_(False)
    if path in ("bias_only", "input_no_grad"):
        x.requires_grad_(False)
    if path == "bias_only":
        for e in extras:
            e.requires_grad_(False)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    forward, backward = Trace(), Trace()
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    run = seq
    if model is not None:
        run, forward, backward, hooks = model(seq), *[contextlib.nullcontext()] * 3
    torch.manual_seed(7)  # NVFP4's stochastic rounding draws its seeds from torch's generator
    with (grad_mode or torch.enable_grad)(), hooks, forward, te.autocast(enabled=quantized,
                                                                           recipe=recipe_cls()):
        outs = as_tuple(run(x, *extras))
    needed = [(o, g.clone()) for o, g in zip(outs, grads) if o.requires_grad]
    if needed and grad_mode is None:
        with backward:
            torch.autograd.backward(*zip(*needed))
    linear = next(m for m in seq.modules() if isinstance(m, te.ops.BasicLinear))
    return dict(outs=[o.detach() for o in outs], dx=x.grad, dextras=[e.grad for e in extras],
                requires_grad=[o.requires_grad for o in outs],
                params={n: p.grad for n, p in seq.named_parameters()}, saved=saved,
                forward=getattr(forward, "ops", None), backward=getattr(backward, "ops", None),
                inputs=[x, *extras],
                sizes=(x.numel() // x.shape[-1], linear.in_features, linear.out_features))


def _path_grads(case, lead, dtype=torch.float32):
    from harness import as_tuple, build, clone_leaf, inputs_for, random_grads_like
    seq = build(case, dtype)
    x, extras = inputs_for(case, dtype, "leading_dims", lead=lead)
    with torch.no_grad():
        return random_grads_like(as_tuple(seq(clone_leaf(x), *[clone_leaf(e) for e in extras])))


def _grads_of(run):
    """The run's gradients by name (None where not computed)."""
    out = {"dx": run["dx"], **{f"dextra{i}": g for i, g in enumerate(run["dextras"])}}
    out.update(run["params"])
    return out


@pytest.mark.parametrize("recipe_cls", list(CONFORMANCE_RECIPES.values()),
                         ids=list(CONFORMANCE_RECIPES))
@pytest.mark.parametrize("case,path", _gemm_path_params())
def test_gemm_case_path_under_a_recipe(case, path, recipe_cls):
    """The cases with a GEMM on the paths users take besides full training, under each recipe:
    frozen weights (the input and bias grads still right, no weight grad, and neither the
    input's quantized copy saved nor anything quantized for the wgrad that is not run),
    bias-only training, an input that needs no grad (the parameter grads still right, the
    weight's copy for the dgrad neither saved nor made), and torch.inference_mode (the no_grad
    forward's output, nothing saved, no grad). Each within the recipe's tolerance of the
    unquantized run on the same path, and bit-equal to the full-training run under the same
    recipe wherever the same quantized operands feed the result."""
    from tolerances import QUANTIZED_RELATIVE_ERROR

    tolerance = QUANTIZED_RELATIVE_ERROR[recipe_cls.__name__]
    case, lead = _case_for(case, recipe_cls)
    grads = _path_grads(case, lead)
    full = _run_path(case, recipe_cls, None, lead, grads, quantized=True)
    mode = torch.inference_mode if path == "inference_mode" else None
    got = _run_path(case, recipe_cls, path, lead, grads, quantized=True, grad_mode=mode)
    ref = _run_path(case, recipe_cls, path, lead, grads, quantized=False, grad_mode=mode)
    # the forward: the full run's under the same recipe, the unquantized one within tolerance
    for a, b, f in zip(got["outs"], ref["outs"], full["outs"]):
        assert torch.equal(a, f)
        assert _rel_err(a, b) < tolerance["forward"]
    assert not torch.equal(got["outs"][0], ref["outs"][0])  # the recipe did apply
    got_grads, ref_grads, full_grads = _grads_of(got), _grads_of(ref), _grads_of(full)
    for name, g in got_grads.items():
        if ref_grads[name] is None:
            assert g is None, name  # not needed: not computed
            continue
        assert g is not None, name
        err = _rel_err(g, ref_grads[name])
        assert err < tolerance["backward"], (name, err)
    if path == "inference_mode":
        # every output but an input handed back (MakeExtraOutput's, or the extra input the
        # residual was added into in place) is a new inference tensor, needing no grad
        inputs = {t.data_ptr() for t in got["inputs"]}
        assert all(o.is_inference() and not r for o, r in zip(got["outs"], got["requires_grad"])
                   if o.data_ptr() not in inputs)
        assert got["saved"] == [] and all(g is None for g in got_grads.values())
        assert not _columnwise_copies(got, recipe_cls)  # no copy for a backward GEMM
        no_grad = _run_path(case, recipe_cls, path, lead, grads, quantized=True,
                            grad_mode=torch.no_grad)
        assert all(torch.equal(a, b) for a, b in zip(got["outs"], no_grad["outs"]))
        return
    weights = [n for n in got_grads if n.endswith("weight")]
    biases = [n for n in got_grads if n.endswith("bias")]
    if path in ("frozen_weight", "bias_only"):
        assert all(got_grads[n] is None for n in weights)
    if path in ("bias_only", "input_no_grad"):
        assert got_grads["dx"] is None
    # bit-equal to the full run where the same quantized operands feed it: the biases' grads
    # (the same dy), dx with frozen weights (the same dy and weight copies), the weights' grads
    # of an input without grad (the same dy and input copies; not under NVFP4, whose stochastic
    # rounding of dy's column-wise copy draws another seed when the row-wise one is not made)
    equal = list(biases)
    if path == "frozen_weight":
        equal += [n for n in got_grads if n == "dx" or n.startswith("dextra")]
    if path == "input_no_grad":
        equal += [n for n in got_grads if n.startswith("dextra")]
        if recipe_cls is not te.recipe.NVFP4BlockScaling:
            equal += weights
    for name in equal:
        if got_grads[name] is not None:
            assert torch.equal(got_grads[name], full_grads[name]), name
    # nothing quantized or saved for a GEMM that does not run: no column-wise copy of its
    # operands made (the block recipes' full run quantizes each; per-tensor FP8 transposes its
    # one copy for the FP8 GEMM), fewer operand copies and fewer bytes saved than in full
    # training
    if recipe_cls in (te.recipe.Float8BlockScaling, te.recipe.MXFP8BlockScaling,
                      te.recipe.NVFP4BlockScaling):
        _, k, n = full["sizes"]
        assert _columnwise_copies(full, recipe_cls) == ({"x", "dy", "w"} if k != n
                                                        else {"x", "dy"})
    unneeded = {"frozen_weight": {"x", "dy"}, "bias_only": {"x", "dy", "w"},
                "input_no_grad": {"w"}}[path]
    assert not _columnwise_copies(got, recipe_cls) & unneeded, (got["forward"], got["backward"])
    if path == "bias_only":  # no GEMM in backward: dy is not quantized at all
        assert _operand_work(got["backward"]) == [], got["backward"]
    assert len(_operand_work(got["forward"] + got["backward"])) < len(
        _operand_work(full["forward"] + full["backward"]))
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    assert nbytes(got["saved"]) < nbytes(full["saved"])


@pytest.mark.parametrize("recipe_cls", [te.recipe.Float8BlockScaling, te.recipe.MXFP8BlockScaling,
                                        te.recipe.NVFP4BlockScaling],
                         ids=["block", "mxfp8", "nvfp4"])
def test_freezing_between_forward_and_backward_keeps_the_pending_copies(recipe_cls):
    """A forward with the weight trained, then one with it frozen (the neighbours handed the
    row-wise-only quantizers), then the first call's backward: its neighbours kept the
    quantizer they were handed (both copies of dy), so its gradients are those of the same call
    without the frozen one in between."""
    def run(freeze_between):
        torch.manual_seed(0)
        model = te.ops.Sequential(te.ops.LayerNorm(64), te.ops.Linear(64, 32), te.ops.GELU())
        x = torch.randn(2, 48, 64, requires_grad=True)
        with te.autocast(recipe=recipe_cls()):
            y = model(x)
            if freeze_between:  # a frozen-weight call, the weight trained again after it
                model[1].weight.requires_grad_(False)
                model(x.detach())
                model[1].weight.requires_grad_(True)
        torch.manual_seed(1)
        y.backward(torch.ones_like(y))
        return x.grad, model[1].weight.grad, model[1].bias.grad

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe_cls", list(CONFORMANCE_RECIPES.values()),
                         ids=list(CONFORMANCE_RECIPES))
@pytest.mark.parametrize("path", GEMM_PATHS)
def test_gemm_case_path_compiled_equals_eager(path, recipe_cls):
    """Each path of test_gemm_case_path_under_a_recipe on Linear+GELU compiled
    (fullgraph=True, aot_eager) gives the eager bits, output and every gradient, under each
    recipe but DelayedScaling, whose compilation is refused."""
    case = next(c for c in _cases() if c.id == "Linear+GELU")
    case, lead = _case_for(case, recipe_cls)
    grads = _path_grads(case, lead)
    mode = torch.inference_mode if path == "inference_mode" else None

    def compiled(seq):
        return torch.compile(seq, backend="aot_eager", fullgraph=True)

    if recipe_cls is te.recipe.DelayedScaling:
        with pytest.raises(te.ops.CompileUnsupportedError,
                           match="^DelayedScaling cannot be compiled; use Float8CurrentScaling"):
            _run_path(case, recipe_cls, path, lead, grads, quantized=True, grad_mode=mode,
                      model=compiled)
        return
    eager = _run_path(case, recipe_cls, path, lead, grads, quantized=True, grad_mode=mode)
    got = _run_path(case, recipe_cls, path, lead, grads, quantized=True, grad_mode=mode,
                    model=compiled)
    assert len(counters["graph_break"]) == 0
    assert all(torch.equal(a, b) for a, b in zip(got["outs"], eager["outs"]))
    assert got["requires_grad"] == eager["requires_grad"]
    for name, g in _grads_of(eager).items():
        c = _grads_of(got)[name]
        assert (c is None) if g is None else torch.equal(c, g), name


@pytest.mark.parametrize("recipe_cls", list(CONFORMANCE_RECIPES.values()),
                         ids=list(CONFORMANCE_RECIPES))
def test_fp8_training_loop_with_inference_steps_and_dtype_cast(recipe_cls):
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(32), te.ops.Linear(32, 64), te.ops.GELU(),
                              te.ops.Linear(64, 32)).bfloat16()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    recipe = recipe_cls()
    losses = []
    for step in range(12):
        x = torch.randn(32, 32, dtype=torch.bfloat16)
        target = torch.sin(x)
        if step % 3 == 2:
            with torch.inference_mode(), te.autocast(recipe=recipe):
                y = model(x)
            assert y.dtype == torch.bfloat16 and not y.requires_grad
            continue
        opt.zero_grad(set_to_none=True)
        with te.autocast(recipe=recipe):
            y = model(x)
        loss = (y.float() - target.float()).pow(2).mean()
        loss.backward()
        assert all(p.grad is not None and p.grad.dtype == torch.bfloat16
                   for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recipe_cls", list(CONFORMANCE_RECIPES.values()),
                         ids=list(CONFORMANCE_RECIPES))
def test_linear_edge_inputs_under_a_recipe(recipe_cls, dtype):
    """LayerNorm -> Linear -> GELU -> Linear under each recipe: a non-contiguous input gives the
    contiguous copy's output and gradients bit for bit, eager and compiled (DelayedScaling:
    eager only, compile refuses it); no tokens at all (the wgrad GEMMs reduce over none) give
    empty outputs and zero parameter gradients. Each run starts from the same model state
    (DelayedScaling updates its scales after a call) and the same seed (NVFP4's stochastic
    rounding draws from torch's generator). NVFP4 runs without stochastic rounding here: its
    seeds differ under inductor (test_nvfp4_stochastic_rounding_compiled_equals_eager)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(64), te.ops.Linear(64, 32), te.ops.GELU(),
                              te.ops.Linear(32, 64)).to(dtype)
    base = torch.randn(64, 64).to(dtype)
    dy = torch.randn(64, 64).to(dtype)
    compiled = recipe_cls is not te.recipe.DelayedScaling
    make_recipe = recipe_cls
    if recipe_cls is te.recipe.NVFP4BlockScaling:
        def make_recipe():
            return te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)
    results = []
    for x in (base.t(), base.t().contiguous()) * (2 if compiled else 1):
        m = copy.deepcopy(model)
        run = torch.compile(m, fullgraph=True) if len(results) >= 2 else m
        x = x.detach().requires_grad_()
        torch.manual_seed(1)
        with te.autocast(recipe=make_recipe()):
            y = run(x)
        y.backward(dy)
        results.append([y.detach(), x.grad, *[p.grad for p in m.parameters()]])
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            assert torch.equal(a, b)
    x0 = torch.randn(0, 64, dtype=dtype, requires_grad=True)
    model.zero_grad(set_to_none=True)
    with te.autocast(recipe=recipe_cls()):
        y0 = model(x0)
    y0.sum().backward()
    assert y0.shape == (0, 64) and x0.grad.shape == (0, 64)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_nvfp4_stochastic_rounding_compiled_equals_eager():
    """NVFP4BlockScaling's default recipe (stochastic rounding of the gradients) compiled with
    inductor gives eager's gradients bit for bit from the same seed: the seeds come from
    te_cpp.random_seeds, which draws from torch's generator in the compiled graph too (an
    in-graph torch.randint would be lowered to inductor's own generator)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 32), te.ops.GELU(), te.ops.Linear(32, 64))
    x0, dy = torch.randn(64, 64), torch.randn(64, 64)
    grads = eager_and_inductor_grads(model, x0, dy, te.recipe.NVFP4BlockScaling())
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_checkpoint_round_trip_with_delayed_scaling_state():
    import io

    recipe = te.recipe.DelayedScaling(amax_history_len=8)

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU(), te.ops.Linear(32, 32))

    model = make()
    xs = [torch.randn(16, 32) * (i + 1) for i in range(4)]
    for x in xs[:3]:
        with te.autocast(recipe=recipe):
            model(x).sum().backward()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["0.basic_ops.0._extra_state"].numel() > 0  # the scales and amax history
    restored = make()
    restored.load_state_dict(state)
    with te.autocast(recipe=recipe):
        y = model(xs[3])
        y2 = restored(xs[3])
    assert torch.equal(y, y2)  # same scales: bit-identical FP8 compute
    a, b = model[0].basic_ops[0]._fp8_metas["forward"], restored[0].basic_ops[0]._fp8_metas["forward"]
    assert torch.equal(a.scale, b.scale) and torch.equal(a.amax_history, b.amax_history)
    # stateless recipes store nothing
    assert te.ops.BasicLinear(4, 4).get_extra_state().numel() == 0


def test_delayed_scaling_updates_after_every_autocast():
    recipe = te.recipe.DelayedScaling(amax_history_len=1)
    op = te.ops.BasicLinear(16, 16)
    for amax in (2.0, 8.0, 4.0):
        x = torch.zeros(4, 16)
        x[0, 0] = amax
        with te.autocast(recipe=recipe):
            op(x)
        # history of length 1: the scale follows the last step's amax
        torch.testing.assert_close(op._fp8_metas["forward"].scale[0], torch.tensor(448.0 / amax))


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_handed_over_operands_equal_quantizing_in_the_consumer(recipe_name):
    """The hand-over changes where the cast happens, not its values: with the protocol the
    LayerNorm+Linear+GELU+Linear stack gives bit-identical results to the same stack with an
    Identity between the producers and the linears (which turns the hand-over off)."""
    make_recipe = RECIPES[recipe_name][0]

    def make(with_barrier):
        torch.manual_seed(0)
        ops = [te.ops.LayerNorm(64), te.ops.Identity(), te.ops.Linear(64, 64), te.ops.GELU(),
               te.ops.Identity(), te.ops.Linear(64, 64)]
        return te.ops.Sequential(*[op for op in ops
                                   if with_barrier or not isinstance(op, te.ops.Identity)])

    outs = []
    for with_barrier in (False, True):
        model = make(with_barrier)
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with te.autocast(recipe=make_recipe()):
            y = model(x)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), x.grad, [p.grad for p in model.parameters()]))
    (y0, dx0, g0), (y1, dx1, g1) = outs
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


# ---- quantized weights (te.quantized_model_init) ------------------------------------------------


def test_quantized_model_init_weights_are_float8_and_train():
    recipe = te.recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU(), te.ops.Linear(32, 32))
    torch.manual_seed(0)
    plain = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU(), te.ops.Linear(32, 32))
    w = model[0].weight
    assert isinstance(w, te.tensor.Float8Tensor) and te.tensor.Float8Tensor is te.Float8Tensor
    assert w._data.dtype == torch.uint8
    x = torch.randn(16, 32, requires_grad=True)
    with te.autocast(recipe=recipe):
        y, y_plain = model(x), plain(x)
    # the FP8 GEMM uses the stored FP8 weight; its values are what quantizing the same
    # high-precision weight per call gives
    assert torch.equal(y, y_plain)
    y.sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32
    before = w.dequantize().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert isinstance(model[0].weight, te.Float8Tensor)  # re-quantized in place
    expected = fq_current(before.double() - 0.1 * w.grad.double(), E4M3)
    torch.testing.assert_close(model[0].weight.dequantize().double(), expected, rtol=0, atol=0)
    # outside autocast the weight is dequantized for the high-precision GEMM
    model(x).sum().backward()


@pytest.mark.parametrize("final", ["float", "half", "bfloat16"])
def test_dtype_cast_keeps_quantized_weights(final):
    with te.quantized_model_init(recipe=te.recipe.Float8CurrentScaling()):
        model = te.ops.Sequential(te.ops.Linear(32, 32, bias=False))
    getattr(model, final)()
    final_dtype = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}[final]
    w = model[0].weight
    assert isinstance(w, te.Float8Tensor) and w.dtype == final_dtype
    x = torch.randn(8, 32, requires_grad=True)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = model(x)
    assert y.dtype == final_dtype
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == final_dtype


def test_quantized_weights_compile():
    recipe = te.recipe.Float8CurrentScaling()
    with te.quantized_model_init(recipe=recipe):
        model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.ReLU())
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(8, 32, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    with te.autocast(recipe=recipe):
        y, yc = model(x), compiled(xc)
    y.sum().backward()
    yc.sum().backward()
    assert torch.equal(y, yc) and torch.equal(x.grad, xc.grad)


def test_mxfp8_quantized_weights_train_compile_cast_and_checkpoint(tmp_path):
    recipe = te.recipe.MXFP8BlockScaling()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        model = te.ops.Sequential(te.ops.Linear(64, 64), te.ops.GELU(), te.ops.Linear(64, 32))
    torch.manual_seed(0)
    plain = te.ops.Sequential(te.ops.Linear(64, 64), te.ops.GELU(), te.ops.Linear(64, 32))
    w = model[0].weight
    assert isinstance(w, te.MXFP8Tensor)
    assert w._rowwise_data is not None and w._columnwise_data is not None
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=recipe):
        y, y_plain = model(x), plain(x)
    assert torch.equal(y, y_plain)  # its buffers are what quantizing the weight per call gives
    y.sum().backward()
    before, grad = w.dequantize().detach().clone(), w.grad.clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    w = model[0].weight
    assert isinstance(w, te.MXFP8Tensor)  # re-quantized in place, both copies
    updated = (before.double() - 0.1 * grad.double()).float()
    torch.testing.assert_close(w.dequantize().double(), fq_mx_rows(updated, E4M3),
                               rtol=0, atol=0)
    torch.testing.assert_close(as_storage(w).dequantize_columnwise().double(),
                               fq_mx_cols(updated, E4M3), rtol=0, atol=0)
    # compiled equals eager
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with te.autocast(recipe=recipe):
        assert torch.equal(compiled(x), model(x))
    # a checkpoint round trip keeps the values; a cast keeps the buffers
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    with te.quantized_model_init(recipe=recipe):
        restored = te.ops.Sequential(te.ops.Linear(64, 64), te.ops.GELU(),
                                     te.ops.Linear(64, 32))
    restored.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=False))
    assert torch.equal(restored[0].weight.dequantize(), w.dequantize())
    model.bfloat16()
    assert isinstance(model[0].weight, te.MXFP8Tensor)
    assert model[0].weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="multiples of 32"):
        with te.quantized_model_init(recipe=recipe):
            te.ops.Linear(32, 48)


def test_delayed_scaling_backward_scales_update_after_backward():
    recipe = te.recipe.DelayedScaling(amax_history_len=1)
    op = te.ops.BasicLinear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    for g in (2.0, 500.0):
        dy = torch.zeros(4, 16)
        dy[0, 0] = g
        with te.autocast(recipe=recipe):
            y = op(x)
        y.backward(dy)
        # E5M2 (HYBRID backward): scale = 57344 / amax(dy) right after this backward
        torch.testing.assert_close(op._fp8_metas["backward"].scale[0], torch.tensor(57344.0 / g))


# ---- te_cpp.fp8_gemm: the FP8 linear's forward GEMM ------------------------------------------

_fp8_gemm = torch.ops.te_cpp.fp8_gemm.default
_fp8_quantize = torch.ops.te_cpp.fp8_quantize.default
_fp8_dequantize = torch.ops.te_cpp.fp8_dequantize.default


def _quantized_operand(shape, fmt, seed):
    torch.manual_seed(seed)
    data, scale_inv, _ = _fp8_quantize(torch.randn(*shape) * 3, fmt, False, 0.0)
    return data, scale_inv


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16,
                                       torch.float64])
@pytest.mark.parametrize("fmts", [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2), (E5M2, E5M2)])
@pytest.mark.parametrize("a_shape", [(5, 48), (2, 3, 48), (0, 48), (4, 0)])
def test_fp8_gemm_cpu_is_the_exact_emulation(a_shape, fmts, out_dtype, monkeypatch):
    """CPU, the fp32 strategy (the only one for outputs other than bfloat16; forced here): both
    operands dequantized to fp32, multiplied with fp32 accumulation (the GEMM linear_fwd runs),
    rounded once to out_dtype: bit for bit what the FP8 linear's emulation computes."""
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "0")
    k = a_shape[-1]
    a, sa = _quantized_operand(a_shape, fmts[0], 0)
    b, sb = _quantized_operand((7, k), fmts[1], 1)
    y = _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], out_dtype)
    ref = torch.ops.te_cpp.linear_fwd(_fp8_dequantize(a, sa, fmts[0], torch.float32),
                                      _fp8_dequantize(b, sb, fmts[1], torch.float32))
    assert y.dtype == out_dtype and y.shape == (*a_shape[:-1], 7)
    assert torch.equal(y, ref.to(out_dtype))
    # and it is a product of the dequantized operands (not, say, of the raw bytes)
    deq = (_fp8_dequantize(a, sa, fmts[0], torch.float64)
           @ _fp8_dequantize(b, sb, fmts[1], torch.float64).t())
    # (fp32 accumulation: fp32's tolerance for a float64 output)
    tol = tols(torch.float32 if out_dtype == torch.float64 else out_dtype)
    torch.testing.assert_close(y.double(), deq, **tol)


def _raw_bf16(data, fmt):
    return data.view(fmt).to(torch.bfloat16)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("fmts", [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)])
@pytest.mark.parametrize("a_shape", [(37, 96), (2, 5, 96), (0, 96), (6, 0)])
def test_fp8_gemm_cpu_bf16_strategy_scales_the_sum_of_exact_products(a_shape, fmts, with_bias,
                                                                     monkeypatch):
    """CPU, the bfloat16 strategy (TECPP_FP8_GEMM_BF16=1; the default for bfloat16 outputs where
    the CPU multiplies bfloat16 natively): the raw FP8 values (exact in bfloat16) multiplied in
    a bfloat16 GEMM with fp32 accumulation, the product of the two scales applied once to the
    sum and the bias added before the one rounding, as cuBLASLt computes an FP8 GEMM."""
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "1")
    k = a_shape[-1]
    a, sa = _quantized_operand(a_shape, fmts[0], 0)
    b, sb = _quantized_operand((24, k), fmts[1], 1)
    torch.manual_seed(2)
    bias = torch.randn(24).to(torch.bfloat16) if with_bias else None
    y = _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], torch.bfloat16, bias)
    assert y.dtype == torch.bfloat16 and y.shape == (*a_shape[:-1], 24)
    rows = a.reshape(math.prod(a_shape[:-1]), k)
    c = (bias if with_bias else torch.zeros(24, dtype=torch.bfloat16)).expand(rows.shape[0], 24)
    want = torch.addmm(c, _raw_bf16(rows, fmts[0]), _raw_bf16(b, fmts[1]).t(),
                       beta=1 if with_bias else 0, alpha=(sa * sb).item())
    assert torch.equal(y.reshape(rows.shape[0], 24), want)
    ref = (a.view(fmts[0]).double() @ b.view(fmts[1]).double().t()) * (sa * sb).double()
    if with_bias:
        ref = ref + bias.double()
    torch.testing.assert_close(y.double(), ref, **tols(torch.bfloat16))
    # the fp32 strategy agrees within bfloat16's tolerance
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "0")
    y32 = _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], torch.bfloat16, bias)
    torch.testing.assert_close(y.float(), y32.float(), **tols(torch.bfloat16))
    # outputs other than bfloat16 take the fp32 strategy whatever the setting
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "1")
    y_f32 = _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], torch.float32)
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "0")
    assert torch.equal(y_f32, _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], torch.float32))


def test_fp8_gemm_cpu_default_strategy_follows_the_cpu(monkeypatch):
    """Unset, TECPP_FP8_GEMM_BF16 follows the CPU: the bfloat16 strategy where it has
    AVX512_BF16 or AMX (bfloat16 GEMMs at several times the fp32 rate), else the fp32 one."""
    caps = getattr(torch.cpu, "get_capabilities", lambda: None)()
    if caps is None:
        pytest.skip("this torch does not report the CPU's capabilities")
    a, sa = _quantized_operand((64, 512), E4M3, 0)
    b, sb = _quantized_operand((64, 512), E4M3, 1)
    got = {}
    for setting in ("0", "1", None):
        if setting is None:
            monkeypatch.delenv("TECPP_FP8_GEMM_BF16", raising=False)
        else:
            monkeypatch.setenv("TECPP_FP8_GEMM_BF16", setting)
        got[setting] = _fp8_gemm(a, sa, E4M3, b, sb, E4M3, torch.bfloat16)
    assert not torch.equal(got["0"], got["1"])  # the two strategies round differently here
    native = bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    assert torch.equal(got[None], got["1" if native else "0"])


def test_fp8_gemm_rejects_bad_operands():
    a, sa = _quantized_operand((4, 32), E4M3, 0)
    b, sb = _quantized_operand((16, 32), E4M3, 1)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: a's last dimension \(shape "
                                           r"\[4, 32\]\) must equal b's \(shape \[16, 16\]\)"):
        _fp8_gemm(a, sa, E4M3, b[:, :16], sb, E4M3, torch.float32)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: a must be uint8"):
        _fp8_gemm(a.float(), sa, E4M3, b, sb, E4M3, torch.float32)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: b_scale_inv must have shape"):
        _fp8_gemm(a, sa, E4M3, b, torch.ones(2), E4M3, torch.float32)
    with pytest.raises(ValueError, match=r"te_cpp\.fp8_gemm: b_fp8_dtype must be"):
        _fp8_gemm(a, sa, E4M3, b, sb, torch.bfloat16, torch.float32)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: bias must be in out_dtype "
                                           r"\(BFloat16\), got Float"):
        _fp8_gemm(a, sa, E4M3, b, sb, E4M3, torch.bfloat16, torch.zeros(16))
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: bias must have shape \[n\] = "
                                           r"\[16\], got \[8\]"):
        _fp8_gemm(a, sa, E4M3, b, sb, E4M3, torch.float32, torch.zeros(8))


@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_fp8_linear_forward_uses_fp8_gemm_for_per_tensor_scaling(recipe_name, monkeypatch):
    """Per-tensor recipes run the forward GEMM as te_cpp.fp8_gemm (bitwise the emulation that
    test_basic_linear_fp8_gemms_match_the_emulation pins); MXFP8 keeps the emulation."""
    from transformer_engine_cpp.ops.basic import basic_linear
    calls = []
    real = basic_linear._fp8_gemm
    monkeypatch.setattr(basic_linear, "_fp8_gemm", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    op = te.ops.BasicLinear(64, 32)
    x = torch.randn(2, 16, 64)
    with te.autocast(recipe=RECIPES[recipe_name][0]()):
        y = op(x)
    assert len(calls) == (1 if recipe_name == "current" else 0)
    # the unfused emulation gives the same bits
    monkeypatch.setattr(basic_linear, "_fp8_gemm_fits", lambda *a: False)
    with te.autocast(recipe=RECIPES[recipe_name][0]()):
        y_emulated = op(x)
    assert torch.equal(y, y_emulated)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe_name", ["current", "mxfp8"])
def test_fp8_linear_backward_uses_fp8_gemm_for_per_tensor_scaling(recipe_name, dtype,
                                                                   monkeypatch):
    """Per-tensor recipes run dgrad (dy row-wise x W column-wise) and wgrad (dy column-wise x x
    column-wise) as te_cpp.fp8_gemm on transposed uint8 copies; on CPU, with the fp32 strategy,
    that is bitwise the dequantize + linear_dgrad / linear_wgrad emulation (the bfloat16
    strategy: test_fp8_gemm_cpu_bf16_strategy_scales_the_sum_of_exact_products). MXFP8 keeps
    the emulation."""
    from transformer_engine_cpp.ops.basic import basic_linear
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "0")
    calls = []
    real = basic_linear._fp8_gemm
    monkeypatch.setattr(basic_linear, "_fp8_gemm",
                        lambda *a: calls.append((tuple(a[0].shape), tuple(a[3].shape))) or real(*a))

    def run():
        torch.manual_seed(0)
        op = te.ops.BasicLinear(64, 32, dtype=dtype)
        x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
        dy = torch.randn(2, 16, 32, dtype=dtype)
        with te.autocast(recipe=RECIPES[recipe_name][0]()):
            y = op(x)
        y.backward(dy)
        return y, x.grad, op.weight.grad

    y, dx, dw = run()
    if recipe_name == "current":
        # forward [2, 16, 64] x [32, 64]; dgrad dy [2, 16, 32] x W^T [64, 32]; wgrad dy^T
        # [32, 32 rows] x x^T [64, 32 rows]
        assert calls == [((2, 16, 64), (32, 64)), ((2, 16, 32), (64, 32)), ((32, 32), (64, 32))]
    else:
        assert calls == []
    assert dx.dtype == dtype and dw.dtype == dtype
    # the dequantize + plain GEMM emulation gives the same bits
    calls.clear()
    monkeypatch.setattr(basic_linear, "_fp8_gemm_takes", lambda *a: False)
    monkeypatch.setattr(basic_linear, "_fp8_gemm_fits", lambda *a: False)
    y_e, dx_e, dw_e = run()
    assert calls == []
    assert torch.equal(y, y_e) and torch.equal(dx, dx_e) and torch.equal(dw, dw_e)


def test_fp8_linear_backward_fp8_gemm_compiled_equals_eager(monkeypatch):
    """Under torch.compile the FP8 backward's dgrad and wgrad are te_cpp.fp8_gemm nodes on
    uint8 operands, with the eager result."""
    from transformer_engine_cpp.ops.basic import basic_linear
    torch.manual_seed(0)
    eager = te.ops.BasicLinear(64, 32)
    comp_model = copy.deepcopy(eager)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(comp_model, backend=backend, fullgraph=True)
    x = torch.randn(48, 64, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    dy = torch.randn(48, 32)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = eager(x)
        yc = compiled(xc)
    y.backward(dy)
    yc.backward(dy)
    torch.testing.assert_close(yc, y, **COMPILED_VS_EAGER)
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    torch.testing.assert_close(comp_model.weight.grad, eager.weight.grad, **COMPILED_VS_EAGER)
    nodes = [n for n in backend.bw_graphs[0].graph.nodes
             if n.op == "call_function" and "fp8_gemm" in str(n.target)]
    shapes = sorted((tuple(n.args[0].meta["val"].shape), tuple(n.args[3].meta["val"].shape))
                    for n in nodes)
    assert shapes == [((32, 48), (64, 48)), ((48, 32), (64, 32))]  # wgrad, dgrad
    assert all(n.args[i].meta["val"].dtype == torch.uint8 for n in nodes for i in (0, 3))
    assert not any("fp8_dequantize" in str(n.target) for n in backend.bw_graphs[0].graph.nodes)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_bf16_model_compiled_equals_eager_with_the_bf16_gemm_strategy(recipe_name, monkeypatch):
    """A bfloat16 pre-norm MLP block with the bfloat16 fp8_gemm strategy forced
    (TECPP_FP8_GEMM_BF16=1): eager is bitwise reproducible (two runs), and compiled
    (fullgraph, aot_eager) gives the same bits, output and every gradient. Under current scaling
    the strategy is in effect (the fp32 one gives other bits); MXFP8's GEMMs (mxfp8_gemm) have
    one strategy, so the setting changes nothing there."""
    make_recipe = RECIPES[recipe_name][0]
    torch.manual_seed(0)
    eager = mlp_block().bfloat16()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    x = torch.randn(32, 64).bfloat16()
    dy = torch.randn(32, 64).bfloat16()

    def run(model):
        xi = x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        with te.autocast(recipe=make_recipe()):
            y = model(xi)
        y.backward(dy)
        return [y.detach(), xi.grad, *[p.grad for p in model.parameters()]]

    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "1")
    first = run(eager)
    assert all(t.dtype == torch.bfloat16 for t in first)
    assert all(torch.equal(a, b) for a, b in zip(first, run(eager)))
    got = run(compiled)
    assert len(counters["graph_break"]) == 0
    assert len(got) == len(first)
    for a, b in zip(got, first):
        assert torch.equal(a, b)
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "0")
    fp32_strategy = run(eager)
    same = all(torch.equal(a, b) for a, b in zip(fp32_strategy, first))
    assert same == (recipe_name == "mxfp8")


def test_fp8_gemm_bf16_strategy_at_a_realistic_shape(monkeypatch):
    """The bfloat16 strategy at 512 x 1024 x 1024 (E4M3 x E4M3, bias): bit for bit the
    documented formula (addmm of the raw FP8 values in bfloat16, alpha = the product of the
    scales, the bias before the one rounding), and the exact result rounded once to bfloat16
    but where the fp32 accumulation moved it (every product of two FP8 values and their sum
    over k = 1024 are exact in float64): at most one bfloat16 ulp plus the fp32 summation bound
    k 2^-24 sum |products| away, and on fewer than 0.1% of the elements."""
    monkeypatch.setenv("TECPP_FP8_GEMM_BF16", "1")
    m, k, n = 512, 1024, 1024
    a, sa = _quantized_operand((m, k), E4M3, 3)
    b, sb = _quantized_operand((n, k), E4M3, 4)
    torch.manual_seed(5)
    bias = torch.randn(n).bfloat16()
    y = _fp8_gemm(a, sa, E4M3, b, sb, E4M3, torch.bfloat16, bias)
    want = torch.addmm(bias.expand(m, n), _raw_bf16(a, E4M3), _raw_bf16(b, E4M3).t(),
                       alpha=(sa * sb).item())
    assert torch.equal(y, want)
    exact = (a.view(E4M3).double() @ b.view(E4M3).double().t()) * (sa * sb).double()
    exact = exact + bias.double()
    ref = exact.to(torch.bfloat16)
    ulp = (ref.double().abs().clamp_min(2.0**-126).log2().floor() - 7).exp2()
    sum_abs = (a.view(E4M3).double().abs() @ b.view(E4M3).double().abs().t()) * (sa * sb).double()
    assert ((y.double() - exact).abs() <= ulp + k * 2.0**-24 * sum_abs).all()
    assert (y != ref).float().mean() < 0.001


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmts", [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)])
def test_fp8_gemm_cuda_matches_the_cpu_emulation(fmts, out_dtype):
    """cuBLASLt's FP8 GEMM (TN, fp32 accumulation, device scale pointers) against the CPU
    emulation: the same products, accumulated in another order."""
    a, sa = _quantized_operand((3, 40, 64), fmts[0], 0)
    b, sb = _quantized_operand((48, 64), fmts[1], 1)
    ref = _fp8_gemm(a, sa, fmts[0], b, sb, fmts[1], torch.float32)
    y = _fp8_gemm(a.cuda(), sa.cuda(), fmts[0], b.cuda(), sb.cuda(), fmts[1], out_dtype)
    assert y.dtype == out_dtype and y.is_cuda
    torch.testing.assert_close(y.cpu().float(), ref.to(out_dtype).float(), **tols(out_dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_fp8_gemm_cuda_refuses_unaligned_sizes():
    a, sa = _quantized_operand((4, 40), E4M3, 0)
    b, sb = _quantized_operand((16, 40), E4M3, 1)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_gemm: .*multiples of 16, got m 4, "
                                           r"n 16, k 40"):
        _fp8_gemm(a.cuda(), sa.cuda(), E4M3, b.cuda(), sb.cuda(), E4M3, torch.bfloat16)


#: Ops that do not take a quantized operand, each as (ops, extra inputs of the call); width 128
_AFTER_QUANTIZE = {
    "Identity": lambda: ([te.ops.Identity()], ()),
    "Bias": lambda: ([te.ops.Bias(128)], ()),
    "ConstantScale": lambda: ([te.ops.ConstantScale(-2.0)], ()),
    "GELU": lambda: ([te.ops.GELU()], ()),
    "SwiGLU": lambda: ([te.ops.SwiGLU()], ()),
    "LayerNorm": lambda: ([te.ops.LayerNorm(128)], ()),
    "RMSNorm": lambda: ([te.ops.RMSNorm(128)], ()),
    "L2Normalization": lambda: ([te.ops.L2Normalization()], ()),
    "Reshape": lambda: ([te.ops.Reshape((-1, 64))], ()),
    "Dropout": lambda: ([te.ops.Dropout(0.5)], ()),
    "AddExtraInput": lambda: ([te.ops.AddExtraInput()], (torch.randn(64, 128),)),
    "MakeExtraOutput": lambda: ([te.ops.MakeExtraOutput()], ()),
    "Bias+GELU": lambda: ([te.ops.Bias(128), te.ops.GELU()], ()),
    "GroupedLinear": lambda: ([te.ops.GroupedLinear(2, 128, 128, bias=False)],
                              (torch.tensor([32, 32]),)),
}


def _outputs(out) -> list:
    return [dequantized(t) for t in as_tuple(out)]


def _recipe_without_draws(recipe_name: str):
    """The conformance recipe; NVFP4 without stochastic rounding, so that runs that quantize
    the same gradient get the same codes."""
    if recipe_name == "nvfp4":
        return te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)
    return CONFORMANCE_RECIPES[recipe_name]()


@pytest.mark.parametrize("recipe_name", list(CONFORMANCE_RECIPES))
@pytest.mark.parametrize("name", list(_AFTER_QUANTIZE))
def test_quantize_op_next_to_ops_that_take_no_quantized_operand(name, recipe_name):
    """A Quantize before an op that takes no quantized operand (anything but a linear or
    another Quantize) hands it the dequantized tensor, and one after it hands its backward the
    dequantized gradient, as TransformerEngine's QuantizedTensor does by falling back to its
    dequantization: the same values as the op on the quantized-dequantized tensor."""
    torch.manual_seed(0)
    ops, extra = _AFTER_QUANTIZE[name]()
    x = torch.randn(64, 128)
    dy_shape = _outputs(te.ops.Sequential(*copy.deepcopy(ops))(x, *extra))[0].shape

    def run(model, inputs, dy=None, seed=1):
        inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        torch.manual_seed(seed)
        with te.autocast(recipe=_recipe_without_draws(recipe_name)):
            outs = _outputs(model(*inputs))
        if dy is not None:
            outs[0].backward(dy)
        return outs, [t.grad for t in inputs], [p.grad for p in model.parameters()]

    # forward: Quantize then the op equals the op on the quantized input, dequantized
    xq = run(te.ops.Sequential(te.ops.Quantize()), [x])[0][0]
    got = run(te.ops.Sequential(te.ops.Quantize(), *copy.deepcopy(ops)), [x, *extra])[0]
    expected = run(te.ops.Sequential(*copy.deepcopy(ops)), [xq, *extra])[0]
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e), f"{name} after Quantize under {recipe_name}: forward differs"
    # backward: the op then a Quantize of the gradient equals the op's backward of the
    # quantized gradient, dequantized
    dy = torch.randn(dy_shape)
    dyq = run(te.ops.Sequential(te.ops.Quantize(forward=False, backward=True)), [dy], dy)[1][0]
    got = run(te.ops.Sequential(*copy.deepcopy(ops), te.ops.Quantize(forward=False, backward=True)),
              [x, *extra], dy)
    expected = run(te.ops.Sequential(*copy.deepcopy(ops)), [x, *extra], dyq.dequantize())
    for g, e in zip(got[1] + got[2], expected[1] + expected[2], strict=True):
        assert (g is None and e is None) or torch.equal(g, e), (
            f"{name} before a backward Quantize under {recipe_name}: a gradient differs")


@pytest.mark.parametrize("name", list(_AFTER_QUANTIZE))
def test_quantize_next_to_ops_that_take_no_quantized_operand_compiled(name):
    """The same pipelines (a Quantize before and one after the op, forward and backward)
    compiled with fullgraph=True equal eager bit for bit (Dropout from the same seed)."""
    for recipe_name in ("current", "mxfp8"):
        ops, extra = _AFTER_QUANTIZE[name]()
        model = te.ops.Sequential(te.ops.Quantize(forward=True, backward=True), *ops,
                                  te.ops.Quantize(forward=False, backward=True))
        x = torch.randn(64, 128)
        results = []
        for runner in (model, torch.compile(copy.deepcopy(model), backend="aot_eager",
                                            fullgraph=True)):
            xi = x.clone().requires_grad_()
            torch.manual_seed(1)
            with te.autocast(recipe=_recipe_without_draws(recipe_name)):
                y = _outputs(runner(xi, *extra))[0]
            y.backward(torch.ones_like(y))
            results.append((y.detach(), dequantized(xi.grad)))
        for got, expected in zip(*results, strict=True):
            assert torch.equal(got, expected), f"{name} under {recipe_name}"


@pytest.mark.parametrize("recipe_name", list(CONFORMANCE_RECIPES))
@pytest.mark.parametrize("between", ["Quantize", "Quantize+Identity"])
def test_quantize_before_a_linear_after_ops_the_backward_does_not_reach(between, recipe_name):
    """An op the backward does not reach hands a Quantize before a trained linear the copies
    that linear's wgrad reads: the Quantize passes them on (an input without grad, a ReLU
    before it, ran into a missing columnwise copy under the block formats). The weight's
    gradients equal those of the same model with an input that needs grad."""
    torch.manual_seed(0)
    mid = [te.ops.Quantize()] + ([te.ops.Identity()] if "Identity" in between else [])
    model = te.ops.Sequential(te.ops.ReLU(), *mid, te.ops.Linear(64, 32))
    x = torch.randn(32, 64)
    dy = torch.randn(32, 32)
    results = []
    for input_grad in (False, True):
        run = copy.deepcopy(model)
        with te.autocast(recipe=_recipe_without_draws(recipe_name)):
            y = run(x.clone().requires_grad_(input_grad))
        y.backward(dy)
        results.append([y.detach(), run[-1].weight.grad, run[-1].bias.grad])
    for got, expected in zip(*results, strict=True):
        assert torch.equal(got, expected)


def test_a_shape_the_recipe_cannot_quantize_under_compile():
    """docs/quantization.md: the ValueError naming the op and the shape is raised eagerly and
    without fullgraph; with fullgraph=True Dynamo reports it as an observed exception whose text
    holds the ValueError."""
    model = te.ops.Sequential(te.ops.Linear(16, 32))
    x = torch.randn(32, 16, requires_grad=True)
    message = r"BasicLinear: MXFP8 needs the last dimension to be a multiple of 32"
    for fullgraph, error in ((False, ValueError), (True, RuntimeError)):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
        with pytest.raises(error, match=message), \
                te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
            compiled(x)
