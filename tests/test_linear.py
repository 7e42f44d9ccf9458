"""Linear and the GEMM fusions at the module level: the compiled pre-norm MLP block keeps the
fused ops in both directions, autocast and dtype casts, main_grad accumulation, user-defined
ops and fusions (TransformerEngine's TestCustomOps), and training loops that change grad mode and
requires_grad (TransformerEngine's TestTrainingLoops)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._dynamo.utils import counters

import transformer_engine_cpp as te
from transformer_engine_cpp.ops import fused as F
from transformer_engine_cpp.ops.fuser import OperationFuser
from transformer_engine_cpp.testing import reference as ref

from harness import pair_fusion
from tolerances import COMPILED_VS_EAGER, tols

FP32 = tols(torch.float32)


def mlp_block(hidden=32, ffn=64, act="gelu", dtype=torch.float32):
    """Pre-norm residual MLP: x + fc2(act(fc1(LayerNorm(x)))), residual by channel; ``ffn`` is
    fc1's output width (SwiGLU halves it)."""
    return ref.te_prenorm_mlp(hidden, ffn // 2 if act == "swiglu" else ffn, activation=act,
                              dtype=dtype)


def randomize(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def plain_mlp(model, x, act="gelu"):
    """float64 reference of mlp_block with the model's parameters."""
    ln, fc1, fc2 = model[1], model[2], model[4]
    d = lambda t: t.detach().double()  # noqa: E731
    h = ref.layer_norm(x, d(ln.weight), d(ln.bias))
    h = ref.linear(h, d(fc1.weight), d(fc1.bias))
    h = ref.gelu(h) if act == "gelu" else ref.swiglu(h)
    return x + ref.linear(h, d(fc2.weight), d(fc2.bias))


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_mlp_block_eager_matches_reference_and_plans(act):
    model = randomize(mlp_block(act=act))
    x = torch.randn(3, 5, 32, requires_grad=True)
    y = model(x)
    y.backward(torch.ones_like(y))
    x64 = x.detach().double().requires_grad_()
    y64 = plain_mlp(model, x64, act)
    y64.backward(torch.ones_like(y64))
    torch.testing.assert_close(y.double(), y64, **FP32)
    torch.testing.assert_close(x.grad.double(), x64.grad, **FP32)
    fuser = model._module_groups[0]
    fwd = [type(op).__name__ for op, _ in fuser._forward_ops]
    bwd = [type(op).__name__ for op, _ in fuser._backward_ops]
    if act == "gelu":
        assert fwd == ["MakeExtraOutput", "LayerNorm", "ForwardLinearBiasActivation",
                       "ForwardLinearBiasAdd"]
        assert bwd == ["MakeExtraOutput", "LayerNorm", "BasicLinear", "BackwardActivationBias",
                       "BackwardLinearBias", "AddExtraInput"]
    else:
        assert fwd == ["MakeExtraOutput", "LayerNorm", "ForwardLinearBiasActivation", "SwiGLU",
                       "ForwardLinearBiasAdd"]


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_compiled_mlp_block_keeps_forward_and_backward_fusions(act):
    eager = randomize(mlp_block(act=act))
    compiled_model = copy.deepcopy(eager)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(compiled_model, backend=backend, fullgraph=True)
    x = torch.randn(4, 32, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    dy = torch.randn(4, 32)
    eager(x).backward(dy)
    compiled(xc).backward(dy)
    assert len(counters["graph_break"]) == 0
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    for (n, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **COMPILED_VS_EAGER, msg=lambda m: f"{n}: {m}")
    fw, bw = backend.fw_graphs[0].code, backend.bw_graphs[0].code
    # forward: the epilogue and residual fusions, and not the unfused ops they replace
    assert "te_cpp.linear_fwd_add" in fw and "te_cpp.bias_fwd" not in fw
    assert "te_cpp.add_extra_input_fwd" not in fw
    if act == "gelu":
        assert "te_cpp.linear_bias_act_fwd" in fw and "te_cpp.gelu_fwd" not in fw
        assert "te_cpp.dbias_dgelu" in bw and "te_cpp.gelu_bwd" not in bw
    # backward: each linear's dgrad + wgrad (+ fc2's dbias) in one linear_bwd call
    assert bw.count("te_cpp.linear_bwd") == 2 and "te_cpp.bias_bwd" not in bw
    assert "te_cpp.linear_dgrad" not in bw and "te_cpp.linear_wgrad" not in bw


@pytest.mark.slow
def test_compiled_mlp_block_inductor():
    eager = randomize(mlp_block())
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="inductor", fullgraph=True)
    x = torch.randn(6, 32, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    eager(x).sum().backward()
    compiled(xc).sum().backward()
    torch.testing.assert_close(xc.grad, x.grad, **FP32)
    for p, q in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **FP32)


# ---- mixed precision --------------------------------------------------------------------------


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_cpu_autocast_outputs_autocast_dtype_and_param_dtype_grads(model_dtype):
    block = randomize(mlp_block(dtype=model_dtype))
    model = te.ops.Sequential(*list(block)[1:5])  # LayerNorm, Linear, GELU, Linear
    x = torch.randn(4, 32, dtype=model_dtype, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == model_dtype
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == model_dtype, name
    # the values follow the float64 reference within a few bf16 roundings
    x64 = x.detach().double()
    torch.testing.assert_close(y.double(), plain_mlp(block, x64) - x64, rtol=5e-2, atol=5e-2)
    # a residual add keeps torch's type promotion under autocast (as x + residual does)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert block(x).dtype == torch.promote_types(torch.bfloat16, model_dtype)


@pytest.mark.parametrize("final", ["float", "half", "bfloat16"])
@pytest.mark.parametrize("init_dtype", [torch.float32, torch.bfloat16])
def test_dtype_cast(init_dtype, final):
    model = te.ops.Sequential(te.ops.Linear(32, 32, bias=False, dtype=init_dtype))
    final_dtype = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}[final]
    getattr(model, final)()
    w = model[0].weight
    assert w.dtype == final_dtype
    x = torch.randn(8, 32, dtype=init_dtype, requires_grad=True)
    y = model(x)
    assert y.dtype == final_dtype
    y.float().sum().backward()
    assert x.grad.dtype == init_dtype
    assert w.grad.dtype == final_dtype
    model.to(torch.float64)
    assert model(x.detach()).dtype == torch.float64


def test_linear_aliases_and_state_dict_keys():
    lin = te.ops.Linear(8, 4)
    assert lin.weight is lin.basic_ops[0].weight and lin.bias is lin.basic_ops[1].bias
    # as TransformerEngine: the basic ops' parameters, plus each basic op's extra state (its
    # delayed-scaling state; empty without one)
    assert set(lin.state_dict()) == {"basic_ops.0.weight", "basic_ops.1.bias",
                                     "basic_ops.0._extra_state", "basic_ops.1._extra_state"}
    new_w = torch.nn.Parameter(torch.zeros(4, 8))
    lin.weight = new_w
    assert lin.basic_ops[0].weight is new_w
    assert te.ops.Linear(8, 4, bias=False).bias is None
    with pytest.raises(ValueError, match="must be basic operations"):
        te.ops.Sequential(lin)(torch.ones(2, 8), op_kwargs={lin: {}})


def test_accumulate_into_main_grad():
    op = te.ops.BasicLinear(16, 8, accumulate_into_main_grad=True)
    op.weight.main_grad = torch.full((8, 16), 0.5)
    x = torch.randn(4, 16, requires_grad=True)
    dy = torch.randn(4, 8)
    op(x).backward(dy)
    assert op.weight.grad is None
    torch.testing.assert_close(op.weight.main_grad, 0.5 + dy.t() @ x.detach(), **FP32)
    torch.testing.assert_close(x.grad, dy @ op.weight.detach(), **FP32)
    op2 = te.ops.BasicLinear(16, 8, accumulate_into_main_grad=True)
    with pytest.raises(RuntimeError, match="needs weight.main_grad"):
        op2(x).sum().backward()
    with pytest.raises(Exception, match="accumulate_into_main_grad adds into weight.main_grad"):
        torch.compile(te.ops.Sequential(op), backend="aot_eager", fullgraph=True)(x)


def test_linear_bad_constructor_arguments():
    with pytest.raises(ValueError, match="BasicLinear: in_features must be a positive int"):
        te.ops.BasicLinear(0, 4)
    with pytest.raises(ValueError, match="BasicLinear: unsupported dtype torch.int32"):
        te.ops.BasicLinear(4, 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="Linear: torch.distributed is not initialized"):
        te.ops.Linear(4, 4, tensor_parallel_mode="row")
    with pytest.raises(TypeError, match="BasicLinear: sequence_parallel must be a bool"):
        te.ops.BasicLinear(4, 4, sequence_parallel=1)
    with pytest.raises(NotImplementedError, match="BasicLinear: userbuffers_options"):
        te.ops.BasicLinear(4, 4, userbuffers_options={"comm_name": "qkv"})
    with pytest.raises(ValueError, match="tensor_parallel_mode must be None"):
        te.ops.BasicLinear(4, 4, tensor_parallel_mode="diagonal")
    with pytest.raises(TypeError, match="Linear: bias must be a bool"):
        te.ops.Linear(4, 4, bias=None)


# ---- user-defined ops and fusions (TransformerEngine's TestCustomOps) ----------------------


class LearnableScale(te.ops.BasicOperation):
    """TransformerEngine docs' example of a user-defined op."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5))

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None,
                   next_op_input_quantizer=None):
        ctx.save_for_backward(input_)
        return self.scale * input_

    def op_backward(self, ctx, grad_output):
        (x,) = ctx.saved_tensors
        return self.scale * grad_output, ((x * grad_output).sum().reshape(()),)


def test_custom_basic_op_eager_and_compiled():
    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(8, 8), LearnableScale(), te.ops.ReLU())

    eager, comp = make(), make()
    x = torch.randn(3, 8, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    eager(x).sum().backward()
    torch.compile(comp, backend="aot_eager", fullgraph=True)(xc).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    w, b = eager[0].weight.detach(), eager[0].bias.detach()
    s = eager[1].scale.detach().clone().requires_grad_()
    torch.relu(s * ref.linear(x2, w, b)).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **FP32)
    torch.testing.assert_close(eager[1].scale.grad, s.grad, **FP32)
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    torch.testing.assert_close(comp[1].scale.grad, eager[1].scale.grad, **COMPILED_VS_EAGER)


class LinearSiLU(te.ops.FusedOperation):
    """A user forward fusion of BasicLinear + SiLU computed with plain torch ops; it populates
    the basic ops' contexts so their unfused backward works (TransformerEngine's ctx contract)."""

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs,
                      prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                      basic_op_kwargs):
        linear, act = self.basic_ops
        lctx, actx = basic_op_ctxs
        z = input_ @ linear.weight.t()
        lctx.with_quantized_compute = False
        lctx.input_quantizer = lctx.weight_quantizer = None
        lctx.grad_output_quantizer = lctx.grad_input_quantizer = None
        lctx.dtype = lctx.input_dtype = input_.dtype
        lctx.weight_requires_grad = linear.weight.requires_grad
        lctx.save_for_backward(input_, linear.weight)
        actx.input_dtype = z.dtype
        actx.save_for_backward(z)
        return torch.nn.functional.silu(z), [(), ()]


_fuse_linear_silu = pair_fusion(te.ops.BasicLinear, te.ops.SiLU, LinearSiLU)


def test_custom_forward_fusion_with_unfused_backward(fusion_registry):
    te.ops.register_forward_fusion(_fuse_linear_silu, prepend=True)
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.BasicLinear(8, 6), te.ops.SiLU())
    x = torch.randn(5, 8, requires_grad=True)
    y = model(x)
    fuser = model._module_groups[0]
    assert [type(op) for op, _ in fuser._forward_ops] == [LinearSiLU]
    assert [type(op) for op, _ in fuser._backward_ops] == [te.ops.BasicLinear, te.ops.SiLU]
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    w = model[0].weight.detach().clone().requires_grad_()
    ref.silu(x2 @ w.t()).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **FP32)
    torch.testing.assert_close(model[0].weight.grad, w.grad, **FP32)


# ---- training loops (TransformerEngine's TestTrainingLoops) --------------------------------


@pytest.mark.parametrize("order", ["train_first", "infer_first"])
def test_training_loop_alternating_grad_modes(order):
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(16), te.ops.Linear(16, 16), te.ops.GELU(),
                              te.ops.Linear(16, 16))
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stages = ["train", "no_grad", "inference", "frozen", "train", "inference", "train"]
    if order == "infer_first":
        stages = stages[1:] + stages[:1]
    for step, stage in enumerate(stages):
        x = torch.randn(4, 16)
        w_frozen = stage == "frozen"
        for p in model[1].parameters():
            p.requires_grad_(not w_frozen)
        if stage == "train" or stage == "frozen":
            opt.zero_grad(set_to_none=True)
            y = model(x)
            y.square().mean().backward()
            # reference gradient from plain torch on the same parameters
            plain.load_state_dict(model.state_dict())
            ps = {n: p.detach().clone().requires_grad_() for n, p in plain.named_parameters()}
            h = ref.layer_norm(x, ps["0.weight"], ps["0.bias"])
            h = ref.gelu(ref.linear(h, ps["1.basic_ops.0.weight"], ps["1.basic_ops.1.bias"]))
            ref.linear(h, ps["3.basic_ops.0.weight"], ps["3.basic_ops.1.bias"]).square().mean().backward()
            for n, p in model.named_parameters():
                if p.requires_grad:
                    torch.testing.assert_close(p.grad, ps[n].grad, **FP32, msg=lambda m: f"{step} {n}: {m}")
                else:
                    assert p.grad is None
            opt.step()
        else:
            ctx = torch.no_grad() if stage == "no_grad" else torch.inference_mode()
            with ctx:
                y = model(x)
            assert not y.requires_grad
            if stage == "inference":
                assert y.is_inference()


def test_model_built_under_inference_mode():
    with torch.inference_mode():
        model = te.ops.Sequential(te.ops.Linear(8, 8), te.ops.ReLU())
        y = model(torch.randn(2, 8))
    assert y.shape == (2, 8)


# ---- fused against unfused ------------------------------------------------------------------


def _fused_cases():
    from cases import OP_CASES
    return [c for c in OP_CASES if c.fused_forward or c.fused_backward]


@pytest.mark.parametrize("case", _fused_cases(), ids=lambda c: c.id)
def test_fused_path_matches_unfused_path(case, fusion_registry):
    """Each fused op gives the unfused basic ops' results (fp32; the fusions only change where
    roundings happen, which fp32 keeps within its tolerance)."""
    from harness import as_tuple, build, eager_run, inputs_for, random_grads_like

    def run():
        seq = build(case, torch.float32)
        x, extras = inputs_for(case, torch.float32, "leading_dims")
        with torch.no_grad():
            grads = random_grads_like(as_tuple(seq(x.detach(), *[e.detach() for e in extras])))
        return seq, eager_run(seq, x, extras, grads)

    fused_seq, fused = run()
    assert any(op.is_fused_op for op, _ in
               fused_seq._module_groups[0]._forward_ops + fused_seq._module_groups[0]._backward_ops)
    for name in ("forward_fusion_functions", "backward_fusion_functions"):
        setattr(OperationFuser, name, [])
    for name in ("extension_forward_fusion_functions", "extension_backward_fusion_functions"):
        setattr(OperationFuser, name, ())
    OperationFuser._fusion_registry_version += 1
    unfused_seq, unfused = run()
    assert not any(op.is_fused_op for op, _ in
                   unfused_seq._module_groups[0]._forward_ops
                   + unfused_seq._module_groups[0]._backward_ops)
    outs, dx, dextras, dparams = fused
    u_outs, u_dx, u_dextras, u_dparams = unfused
    for a, b in zip(outs, u_outs):
        torch.testing.assert_close(a, b, **FP32)
    torch.testing.assert_close(dx, u_dx, **FP32)
    for a, b in zip(dextras, u_dextras):
        torch.testing.assert_close(a, b, **FP32)
    for name, g in dparams.items():
        torch.testing.assert_close(g, u_dparams[name], **FP32, msg=lambda m: f"{name}: {m}")


# ---- regressions ------------------------------------------------------------------------------


def test_scale_change_after_planning_is_seen_by_the_fused_forward():
    scale = te.ops.ConstantScale(1.0)
    model = te.ops.Sequential(te.ops.BasicLinear(4, 4), scale, te.ops.AddExtraInput())
    x, e = torch.randn(2, 4), torch.zeros(2, 4)
    y1 = model(x, e)
    scale.scale = 2.0
    y2 = model(x, e)
    assert [type(op) for op, _ in model._module_groups[0]._forward_ops] == [F.ForwardLinearScaleAdd]
    torch.testing.assert_close(y2, 2 * y1, **FP32)


def test_fused_in_place_add_into_a_strided_buffer():
    model = te.ops.Sequential(te.ops.Linear(4, 4), te.ops.AddExtraInput(in_place=True))
    base = torch.zeros(4, 8)
    extra = base[:, ::2]  # non-contiguous view
    x = torch.randn(4, 4)
    y = model(x, extra)
    lin = model[0]
    expected = ref.linear(x, lin.weight.detach(), lin.bias.detach())
    torch.testing.assert_close(base[:, ::2], expected, **FP32)  # written into the caller's buffer
    torch.testing.assert_close(y, expected, **FP32)


def test_bias_grad_in_the_input_dtype_under_autocast():
    model = te.ops.Sequential(te.ops.Bias(8))
    x = torch.randn(3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and model[0].bias.grad.dtype == torch.float32


def test_rejected_sequential_change_leaves_it_unchanged():
    model = te.ops.Sequential(te.ops.ReLU())
    with pytest.raises(ValueError, match="has no producer"):
        model.append(te.ops.AddExtraInput().set_extra_input_channel(0, "nowhere"))
    assert len(model) == 1
    torch.testing.assert_close(model(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_linear_ops_called_directly_on_tensors_that_require_grad():
    """The kernels' inner ATen GEMMs run below autograd: calling a te_cpp op directly on
    parameters works (and, like every te_cpp op, is not differentiable on its own)."""
    w = torch.nn.Parameter(torch.randn(4, 8))
    b = torch.nn.Parameter(torch.randn(4))
    x = torch.randn(3, 8, requires_grad=True)
    y = torch.ops.te_cpp.linear_fwd(x, w, b)
    y2, z = torch.ops.te_cpp.linear_bias_act_fwd(x, w, b, "relu")
    assert not y.requires_grad
    torch.testing.assert_close(y, ref.linear(x.detach(), w.detach(), b.detach()), **FP32)
    torch.testing.assert_close(z, y, **FP32)
    dy = torch.randn(3, 4, requires_grad=True)
    torch.testing.assert_close(torch.ops.te_cpp.linear_dgrad(dy, w), dy.detach() @ w.detach(),
                               **FP32)


# ---- 16-bit GEMMs on CPUs without a fast 16-bit GEMM -------------------------------------------

_GEMM_FP32 = "TECPP_GEMM_16BIT_IN_FP32"


def _linear_gemms(dtype, alpha=-0.5):
    """linear_fwd (without and with bias), linear_dgrad and linear_wgrad (alpha), each with
    what its GEMM computes in fp32: {name: (output, fp32 result before the one rounding)}."""
    ops = torch.ops.te_cpp
    g = torch.Generator().manual_seed(5)
    x, w, b, dy = (torch.randn(*s, generator=g).to(dtype)
                   for s in ((67, 512), (96, 512), (96,), (67, 96)))
    f = lambda t: t.float()  # noqa: E731
    zero = torch.zeros(())
    return {
        "fwd": (ops.linear_fwd(x, w), torch.mm(f(x), f(w).t())),
        "fwd+bias": (ops.linear_fwd(x, w, b), torch.addmm(f(b), f(x), f(w).t())),
        "dgrad": (ops.linear_dgrad(dy, w, alpha),
                  torch.addmm(zero, f(dy), f(w), beta=0, alpha=alpha)),
        "wgrad": (ops.linear_wgrad(dy, x, alpha),
                  torch.addmm(zero, f(dy).t(), f(x), beta=0, alpha=alpha)),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16bit_gemm_in_fp32_is_the_fp32_product_rounded_once(dtype, monkeypatch):
    """TECPP_GEMM_16BIT_IN_FP32=1: the GEMM of 16-bit operands runs as ATen's fp32 GEMM of their
    values (each product exact in fp32), rounded once to the dtype: the bits of that fp32
    computation. =0: ATen's 16-bit GEMM as it is (also fp32 accumulation, its own order)."""
    monkeypatch.setenv(_GEMM_FP32, "1")
    for name, (got, want32) in _linear_gemms(dtype).items():
        assert got.dtype == dtype
        assert torch.equal(got, want32.to(dtype)), name
    monkeypatch.setenv(_GEMM_FP32, "0")
    ops = torch.ops.te_cpp
    x, w = (torch.randn(67, 512).to(dtype), torch.randn(96, 512).to(dtype))
    assert torch.equal(ops.linear_fwd(x, w), torch.mm(x, w.t()))
    for name, (got, want32) in _linear_gemms(dtype).items():
        torch.testing.assert_close(got.float(), want32, **tols(dtype), msg=name)


def test_16bit_gemm_default_follows_the_cpu(monkeypatch):
    """Unset, TECPP_GEMM_16BIT_IN_FP32 follows the CPU: ATen's 16-bit GEMM where oneDNN runs it
    (bf16: AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX; fp16: AVX512-FP16, AVX-NE-CONVERT or AMX-FP16),
    else the fp32 GEMM, since ATen's fallback is a scalar loop (1.3 bf16 against 75 fp32 GFLOP/s on
    a 1-thread AMD EPYC without AVX-512)."""
    caps = getattr(torch.cpu, "get_capabilities", lambda: None)()
    if caps is None:
        pytest.skip("this torch does not report the CPU's capabilities")
    native = {
        torch.bfloat16: bool(caps.get("avx512_bw") and caps.get("avx512_vl")
                             and caps.get("avx512_dq") or caps.get("avx_ne_convert")
                             or caps.get("amx_bf16")),
        torch.float16: bool(caps.get("avx512_fp16") or caps.get("avx_ne_convert")
                            or caps.get("amx_fp16")),
    }
    from transformer_engine_cpp import _C
    monkeypatch.delenv(_GEMM_FP32, raising=False)
    assert _C.gemm_16bit_in_fp32() == ((0 if native[torch.bfloat16] else 1)
                                       | (0 if native[torch.float16] else 2))
    monkeypatch.setenv(_GEMM_FP32, "1")
    assert _C.gemm_16bit_in_fp32() == 3
    for dtype, fast in native.items():
        got = {}
        for setting in ("0", "1", None):
            if setting is None:
                monkeypatch.delenv(_GEMM_FP32, raising=False)
            else:
                monkeypatch.setenv(_GEMM_FP32, setting)
            got[setting] = [out for out, _ in _linear_gemms(dtype).values()]
        assert any(not torch.equal(a, b) for a, b in zip(got["0"], got["1"])), dtype
        want = got["0" if fast else "1"]
        assert all(torch.equal(a, b) for a, b in zip(got[None], want)), dtype


# ---- linear_bwd and BackwardLinearBias -------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("alpha", [1.0, -0.5])
def test_linear_bwd_is_dgrad_wgrad_and_bias_bwd_in_one_call(dtype, alpha):
    """The same GEMMs and column sum as the three separate ops (the same bits), and the float64
    products within the dtype's tolerance; without a bias dtype, dbias is an empty [0]."""
    ops = torch.ops.te_cpp
    dy, x = torch.randn(2, 3, 7, dtype=dtype), torch.randn(2, 3, 13, dtype=dtype)
    w = torch.randn(7, 13, dtype=dtype)
    dx, dw, db = ops.linear_bwd(dy, x, w, alpha, torch.float32)
    torch.testing.assert_close(dx, ops.linear_dgrad(dy, w, alpha), rtol=0, atol=0)
    torch.testing.assert_close(dw, ops.linear_wgrad(dy, x, alpha), rtol=0, atol=0)
    torch.testing.assert_close(db, ops.bias_bwd(dy, torch.float32), rtol=0, atol=0)
    d = lambda t: t.double()  # noqa: E731
    torch.testing.assert_close(dx.double(), alpha * d(dy) @ d(w), **tols(dtype))
    torch.testing.assert_close(dw.double(), alpha * d(dy).reshape(-1, 7).t() @ d(x).reshape(-1, 13),
                               **tols(dtype))
    torch.testing.assert_close(db.double(), d(dy).sum((0, 1)), **tols(torch.float32))
    assert db.dtype == torch.float32 and dx.dtype == dw.dtype == dtype
    *_, empty = ops.linear_bwd(dy, x, w, alpha)
    assert empty.shape == (0,)


def test_linear_bwd_bad_inputs():
    ops = torch.ops.te_cpp
    dy, x, w = torch.randn(3, 7), torch.randn(3, 13), torch.randn(7, 13)
    with pytest.raises(RuntimeError, match=r"te_cpp\.linear_bwd: input's last dimension "
                                           r"\(shape \[3, 12\]\) must equal in_features"):
        ops.linear_bwd(dy, torch.randn(3, 12), w)
    with pytest.raises(RuntimeError, match=r"te_cpp\.linear_bwd: grad_output's last dimension"):
        ops.linear_bwd(torch.randn(3, 6), x, w)
    with pytest.raises(RuntimeError, match=r"te_cpp\.linear_bwd: grad_output \(shape \[4, 7\]\) "
                                           r"and input \(shape \[3, 13\]\) must share"):
        ops.linear_bwd(torch.randn(4, 7), x, w)
    with pytest.raises(RuntimeError, match=r"te_cpp\.linear_bwd: .*same dtype"):
        ops.linear_bwd(dy, x.double(), w)
    with pytest.raises(RuntimeError, match=r"te_cpp\.linear_bwd: bias dtype must be float32.*"
                                           r"got Int"):
        ops.linear_bwd(dy, x, w, 1.0, torch.int32)


@pytest.mark.parametrize("frozen", ["nothing", "bias", "weight", "input"])
def test_backward_linear_bias_with_frozen_tensors(frozen):
    """Linear(bias=True)'s backward is one linear_bwd call when dx, dW and dbias are all needed
    (without dbias when the bias is frozen); with the weight or input frozen the GEMM it needs
    and bias_bwd. The gradients match float64 in every case."""
    model = te.ops.Sequential(te.ops.Linear(13, 7))
    plan, = model.fusion_plan(torch.randn(5, 13), requires_grad=True)
    assert [type(op) for op, _ in plan.backward_ops] == [F.BackwardLinearBias]
    lin = model[0]
    if frozen == "bias":
        lin.bias.requires_grad_(False)
    if frozen == "weight":
        lin.weight.requires_grad_(False)
    x = torch.randn(2, 3, 13, requires_grad=frozen != "input")
    dy = torch.randn(2, 3, 7)
    model(x).backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = lin.weight.detach().double().requires_grad_()
    b64 = lin.bias.detach().double().requires_grad_()
    ref.linear(x64, w64, b64).backward(dy.double())
    for got, want, needed in ((x.grad, x64.grad, frozen != "input"),
                              (lin.weight.grad, w64.grad, frozen != "weight"),
                              (lin.bias.grad, b64.grad, frozen != "bias")):
        if needed:
            torch.testing.assert_close(got.double(), want, **FP32)
        else:
            assert got is None


# ---- bias fusion decided at plan time ----------------------------------------------------------

# A bf16 GEMM output (rounded to bf16) plus an fp32 bias, against float64: an absolute error of
# a few bf16 roundings of values of order 1.
MIXED = dict(rtol=1.6e-2, atol=2e-2)


def _mixed_linear_bias(tail: str):
    """A bf16 BasicLinear, an fp32 Bias and ``tail`` ("", "gelu" or "add": an AddExtraInput)."""
    torch.manual_seed(0)
    ops = [te.ops.BasicLinear(8, 8, dtype=torch.bfloat16), te.ops.Bias(8, dtype=torch.float32)]
    ops += {"": [], "gelu": [te.ops.GELU()], "add": [te.ops.AddExtraInput()]}[tail]
    model = te.ops.Sequential(*ops)
    with torch.no_grad():
        model[1].bias.normal_()
    return model


def _names(ops) -> list:
    return [type(op).__name__ for op, _ in ops]


def _run_mixed(model, tail: str, autocast: bool):
    """One step, checked against float64; returns the output."""
    model.zero_grad(set_to_none=True)
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    extra = [torch.randn(3, 8)] if tail == "add" else []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = model(x, *extra)
    dy = torch.randn(y.shape)
    y.backward(dy.to(y.dtype))
    x64 = x.detach().double().requires_grad_()
    w64 = model[0].weight.detach().double().requires_grad_()
    b64 = model[1].bias.detach().double().requires_grad_()
    y64 = ref.linear(x64, w64, b64)
    if tail == "gelu":
        y64 = ref.gelu(y64)
    elif tail == "add":
        y64 = y64 + extra[0].double()
    y64.backward(dy.to(y.dtype).double())
    tol = MIXED if not autocast else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(y.double(), y64.detach(), **tol)
    for got, want in ((x.grad, x64.grad), (model[0].weight.grad, w64.grad),
                      (model[1].bias.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, **tol)
    return y


# forward and backward plans of bf16 BasicLinear + fp32 Bias (+ tail) without autocast
_UNFUSED_BIAS_PLANS = {
    "": (["BasicLinear", "Bias"], ["BasicLinear", "Bias"]),
    "gelu": (["BasicLinear", "ForwardBiasActivation"], ["BasicLinear", "BackwardActivationBias"]),
    "add": (["BasicLinear", "Bias", "AddExtraInput"], ["BasicLinear", "Bias", "AddExtraInput"]),
}
# the same under autocast
_FUSED_BIAS_PLANS = {
    "": (["ForwardLinearBiasActivation"], ["BackwardLinearBias"]),
    "gelu": (["ForwardLinearBiasActivation"], ["BasicLinear", "BackwardActivationBias"]),
    "add": (["ForwardLinearBiasAdd"], ["BackwardLinearBias", "AddExtraInput"]),
}


@pytest.mark.parametrize("tail", ["", "gelu", "add"])
def test_bias_of_another_dtype_is_not_planned_into_the_gemm(tail):
    """Without autocast the unfused Bias promotes a bf16 GEMM output and an fp32 bias to fp32,
    so no fusion adds that bias inside the GEMM (nor takes its dbias from the linear's bf16 dy):
    the plan says so, and the output keeps the promotion."""
    model = _mixed_linear_bias(tail)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    extra = [torch.randn(3, 8)] if tail == "add" else []
    plan, = model.fusion_plan(x, *extra, requires_grad=True)
    assert (_names(plan.forward_ops), _names(plan.backward_ops)) == _UNFUSED_BIAS_PLANS[tail]
    y = _run_mixed(model, tail, autocast=False)
    assert y.dtype == torch.float32
    assert model[0].weight.grad.dtype == torch.bfloat16
    assert model[1].bias.grad.dtype == torch.float32


@pytest.mark.parametrize("tail", ["", "gelu", "add"])
def test_bias_of_another_dtype_is_planned_into_the_gemm_under_autocast(tail):
    """Under torch autocast both are cast to the autocast dtype, so the bias rides in the GEMM;
    leaving autocast re-plans to the unfused bias."""
    model = _mixed_linear_bias(tail)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    extra = [torch.randn(3, 8)] if tail == "add" else []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plan, = model.fusion_plan(x, *extra, requires_grad=True)
    assert (_names(plan.forward_ops), _names(plan.backward_ops)) == _FUSED_BIAS_PLANS[tail]
    y = _run_mixed(model, tail, autocast=True)
    # the fp32 residual promotes, as x + residual does under autocast
    assert y.dtype == (torch.float32 if tail == "add" else torch.bfloat16)
    fuser = model._module_groups[0]
    assert _names(fuser._forward_ops) == _FUSED_BIAS_PLANS[tail][0]
    plan, = model.fusion_plan(x, *extra, requires_grad=True)
    assert (_names(plan.forward_ops), _names(plan.backward_ops)) == _UNFUSED_BIAS_PLANS[tail]
    _run_mixed(model, tail, autocast=False)
    assert _names(fuser._forward_ops) == _UNFUSED_BIAS_PLANS[tail][0]


def test_dtype_cast_re_plans_the_bias_fusion(fusion_registry):
    """``model.to(dtype)`` after a call re-plans: an fp32 bias after a bf16 linear fuses once
    both are bf16, and TransformerEngine's own fusion of ``[BasicLinear, Bias]`` (fp16/bf16
    weights only, as a user's forward fusion sees it) appears after an fp32 model's cast."""
    seen = []

    def spy(ops, *, recipe=None):
        seen.append(_names([(op, None) for op in ops]))
        return ops

    te.ops.register_forward_fusion(spy)
    model = _mixed_linear_bias("")
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    model(x).sum().backward()
    fuser = model._module_groups[0]
    assert _names(fuser._forward_ops) == ["BasicLinear", "Bias"]
    assert seen[-1] == ["BasicLinear", "Bias"]
    model.to(torch.bfloat16)
    model(x).sum().backward()
    assert _names(fuser._forward_ops) == ["ForwardLinearBiasActivation"]
    assert _names(fuser._backward_ops) == ["BackwardLinearBias"]
    assert seen[-1] == ["ForwardLinearBiasActivation"]

    model = te.ops.Sequential(te.ops.Linear(8, 8))
    x = torch.randn(3, 8, requires_grad=True)
    model(x).sum().backward()
    assert seen[-1] == ["BasicLinear", "Bias"]
    model.to(torch.bfloat16)
    model(x.detach().bfloat16().requires_grad_()).sum().backward()
    assert seen[-1] == ["ForwardLinearBiasActivation"]


class _WrongGradCount(te.ops.BasicOperation):
    """A user op whose backward returns no grad for its one parameter (a contract error)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None,
                   next_op_input_quantizer=None):
        return input_ * 2.0

    def op_backward(self, ctx, grad_output):
        return grad_output * 2.0, ()


@pytest.mark.parametrize("extra", [False, True], ids=["eager-fast-path", "general-path"])
def test_wrong_parameter_grad_count_is_a_clear_error(extra):
    """Both eager pipeline Functions (the fast path, and the general one that extra tensors
    take) name the op whose backward broke the contract."""
    body = [te.ops.Linear(4, 4), _WrongGradCount()]
    if extra:
        body.append(te.ops.MakeExtraOutput())
    model = te.ops.Sequential(*body)
    out = model(torch.randn(2, 4, requires_grad=True))
    y = out[0] if extra else out
    with pytest.raises(RuntimeError, match=r"_WrongGradCount.* returned 0 parameter grads.*"
                                           r"expected 1"):
        y.sum().backward()


# ---- the front end's GEMM operands ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_weight_layouts_reach_the_gemm_as_they_are(layout):
    """The front end hands a weight with a unit-stride dim to the GEMM as it is (transposed
    or not, leading dimension = its other stride) and copies any other layout: every linear op
    equals the float64 product for each, and a weight with no unit-stride dim gives the bits of
    a contiguous copy of the operand the GEMM reads (W^T forward, W for dgrad), as at::mm."""
    ops = torch.ops.te_cpp
    torch.manual_seed(0)
    base = torch.randn(7, 13)
    w = {"contiguous": base, "transposed": base.t().contiguous().t(),
         "strided": torch.randn(7, 26)[:, ::2].copy_(base)}[layout]
    assert torch.equal(w, base)
    x, dy, b = torch.randn(2, 3, 13), torch.randn(2, 3, 7), torch.randn(7)
    d = lambda t: t.double()  # noqa: E731
    outs = {
        "fwd": (ops.linear_fwd(x, w, b), d(x) @ d(w).t() + d(b)),
        "act": (ops.linear_bias_act_fwd(x, w, b, "relu")[0], (d(x) @ d(w).t() + d(b)).relu()),
        "add": (ops.linear_fwd_add(x, w, b, dy, 0.5), d(dy) + 0.5 * d(x) @ d(w).t() + d(b)),
        "dgrad": (ops.linear_dgrad(dy, w, 2.0), 2.0 * d(dy) @ d(w)),
        "dgrad_add": (ops.linear_dgrad_add(dy, w, x, 1.0), d(x) + d(dy) @ d(w)),
        "bwd": (ops.linear_bwd(dy, x, w, 1.0, None)[0], d(dy) @ d(w)),
    }
    for name, (got, want) in outs.items():
        torch.testing.assert_close(got.double(), want, **FP32, msg=lambda m: f"{name}: {m}")
        if layout == "strided":
            wt = base.t().contiguous().t()  # W^T contiguous
            fn = {"fwd": lambda: ops.linear_fwd(x, wt, b),
                  "act": lambda: ops.linear_bias_act_fwd(x, wt, b, "relu")[0],
                  "add": lambda: ops.linear_fwd_add(x, wt, b, dy, 0.5),
                  "dgrad": lambda: ops.linear_dgrad(dy, base, 2.0),
                  "dgrad_add": lambda: ops.linear_dgrad_add(dy, base, x, 1.0),
                  "bwd": lambda: ops.linear_bwd(dy, x, base, 1.0, None)[0]}[name]
            assert torch.equal(got, fn()), name


# ---- the CUDA backend's epilogues (cuBLASLt) -------------------------------------------------
# The conformance cases (7 out_features) reach the fallbacks; these shapes reach cuBLASLt's
# fused epilogues too (GELU_AUX needs out_features % 8 == 0), and fp64 (no fused epilogues).

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@_CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("out_features", [64, 7])
@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
def test_cuda_linear_epilogues_match_cpu(act, out_features, dtype):
    ops = torch.ops.te_cpp
    torch.manual_seed(0)
    x, w = torch.randn(3, 40, 48, dtype=dtype), torch.randn(out_features, 48, dtype=dtype)
    b, dy = torch.randn(out_features, dtype=dtype), torch.randn(3, 40, out_features, dtype=dtype)
    cuda = lambda *ts: [t.cuda() if isinstance(t, torch.Tensor) else t for t in ts]  # noqa: E731
    tol = tols(dtype)
    for bias in (b, None):
        y, z = ops.linear_bias_act_fwd(*cuda(x, w, bias), act)
        y_ref, z_ref = ops.linear_bias_act_fwd(x, w, bias, act)
        torch.testing.assert_close(z.cpu(), z_ref, **tol)
        torch.testing.assert_close(y.cpu(), y_ref, **tol)
        torch.testing.assert_close(ops.linear_fwd(*cuda(x, w, bias)).cpu(),
                                   ops.linear_fwd(x, w, bias), **tol)
        torch.testing.assert_close(ops.linear_fwd_add(*cuda(x, w, bias, dy, 0.5)).cpu(),
                                   ops.linear_fwd_add(x, w, bias, dy, 0.5), **tol)
    for alpha in (1.0, -0.5):
        for bias_dtype in (None, dtype, torch.float32):
            got = ops.linear_bwd(*cuda(dy, x, w), alpha, bias_dtype)
            want = ops.linear_bwd(dy, x, w, alpha, bias_dtype)
            for g, r in zip(got, want):
                assert g.dtype == r.dtype and g.shape == r.shape
                torch.testing.assert_close(g.cpu(), r, **tols(r.dtype if r.numel() else dtype))
    # the same bits every run (no atomics, the heuristics' choice cached)
    first = ops.linear_bwd(*cuda(dy, x, w), 1.0, dtype)
    again = ops.linear_bwd(*cuda(dy, x, w), 1.0, dtype)
    assert all(torch.equal(p, q) for p, q in zip(first, again))


@_CUDA
def test_cuda_linear_empty_reduction_and_in_place_add():
    ops = torch.ops.te_cpp
    x, w, b = torch.randn(5, 0, device="cuda"), torch.randn(16, 0, device="cuda"), torch.randn(
        16, device="cuda")
    y, z = ops.linear_bias_act_fwd(x, w, b, "gelu")
    torch.testing.assert_close(z, b.expand(5, 16))
    dw = ops.linear_wgrad(torch.randn(0, 16, device="cuda"), torch.randn(0, 8, device="cuda"))
    assert torch.equal(dw, torch.zeros(16, 8, device="cuda"))
    _, _, db = ops.linear_bwd(torch.randn(0, 16, device="cuda"), torch.randn(0, 8, device="cuda"),
                              torch.randn(16, 8, device="cuda"), 1.0, torch.float32)
    assert torch.equal(db, torch.zeros(16, device="cuda"))
    extra = torch.randn(4, 16, device="cuda")
    x, w = torch.randn(4, 32, device="cuda"), torch.randn(16, 32, device="cuda")
    want = ops.linear_fwd_add(x.cpu(), w.cpu(), b.cpu(), extra.cpu(), 2.0)
    ops.linear_fwd_add_inplace(extra, x, w, b, 2.0)
    torch.testing.assert_close(extra.cpu(), want, **FP32)
