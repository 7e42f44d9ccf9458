"""ForwardBiasActivation (Bias followed by a unary activation, one bias_act_fwd pass) with the
backward recomputing the activation's input from the saved (input, bias): results equal the
unfused path's exactly, whichever way the backward is planned; less is saved for backward."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.ops.fuser import OperationFuser
from transformer_engine_cpp.ops.fused import (BackwardActivationBias, ForwardBiasActivation,
                                              extend_forward_bias_activation)
from transformer_engine_cpp.testing import reference as ref

from activations import BIAS_ACT
from test_memory import saved_activation_bytes

ACTS = [cls for cls in BIAS_ACT if cls.fuses_dbias_dact]  # both fusions apply


def _run(act_cls, x_dtype, bias_dtype, *, seed=0, shape=(3, 5, 37)):
    torch.manual_seed(seed)
    seq = te.ops.Sequential(te.ops.Bias(shape[-1], dtype=bias_dtype), act_cls())
    with torch.no_grad():
        seq[0].bias.normal_()
        seq[0].bias[:4] = 0.0
    x = torch.randn(shape, dtype=x_dtype)
    # x + bias subnormal in fp32 (and in bf16) in the first columns: rounded to the input's
    # dtype as the unfused Bias stores it, which the activation (ReLU's x > 0) can see
    x[..., :4] = torch.tensor([1e-39, -1e-39, 3e-39, 5e-40], dtype=x_dtype)
    x.requires_grad_(True)
    dy = torch.randn(shape, dtype=torch.promote_types(x_dtype, bias_dtype))
    y = seq(x)
    y.backward(dy)
    fuser = seq._module_groups[0]
    plan = ([type(op) for op, _ in fuser._forward_ops], [type(op) for op, _ in fuser._backward_ops])
    return y.detach(), x.grad, seq[0].bias.grad, plan


def _without_forward_fusion():
    OperationFuser.extension_forward_fusion_functions = tuple(
        f for f in OperationFuser.extension_forward_fusion_functions
        if f is not extend_forward_bias_activation)
    OperationFuser._fusion_registry_version += 1


@pytest.mark.parametrize("act_cls", ACTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32),
                                    (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32)],
                         ids=["fp32", "bf16", "bf16+fp32bias"])
def test_fused_forward_equals_unfused_forward_exactly(act_cls, dtypes, fusion_registry):
    """The fused forward and the backward from the saved (input, bias) give bit-identical
    results to Bias then act (both with the fused dbias+dact backward), in every dtype."""
    fused = _run(act_cls, *dtypes)
    assert fused[3] == ([ForwardBiasActivation], [BackwardActivationBias])
    _without_forward_fusion()
    unfused = _run(act_cls, *dtypes)
    assert unfused[3] == ([te.ops.Bias, act_cls], [BackwardActivationBias])
    for a, b in zip(fused[:3], unfused[:3]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert fused[1].dtype == dtypes[0]  # dx in the input's dtype, as the unfused Bias


@pytest.mark.parametrize("act_cls", ACTS, ids=lambda c: c.__name__)
def test_unfused_backward_recomputes_the_activation_input(act_cls, fusion_registry):
    """With no backward fusion, the activation's own backward reads (input, bias) from the
    fused forward's context: same results as the fully unfused path."""
    OperationFuser.backward_fusion_functions = []
    OperationFuser.extension_backward_fusion_functions = ()
    OperationFuser._fusion_registry_version += 1
    fused = _run(act_cls, torch.bfloat16, torch.bfloat16)
    assert fused[3] == ([ForwardBiasActivation], [te.ops.Bias, act_cls])
    _without_forward_fusion()
    unfused = _run(act_cls, torch.bfloat16, torch.bfloat16)
    assert unfused[3] == ([te.ops.Bias, act_cls], [te.ops.Bias, act_cls])
    for a, b in zip(fused[:3], unfused[:3]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("act_cls", ACTS, ids=lambda c: c.__name__)
def test_dbias_dact_is_bitwise_equal_whatever_the_thread_count(act_cls, dtype):
    """dbias_d<act>'s rows and its dbias row blocks split over 1, 2 and 3 threads give the same
    bits, without and with the bias recomputed into the activation's input (bf16 at this size
    reads the tables where the CPU uses them; 300 columns leave a partial vector per row)."""
    g = torch.Generator().manual_seed(0)
    rows, width = 1000, 300
    x, dy = (torch.randn(rows, width, generator=g).to(dtype) for _ in range(2))
    bias = torch.randn(width, generator=g).to(dtype)
    op = getattr(torch.ops.te_cpp, f"dbias_d{act_cls.op_stem}")
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append([t for with_bias in (None, bias) for t in op(dy, x, dtype, with_bias)])
    finally:
        torch.set_num_threads(before)
    names = ["dx", "dbias", "dx (bias)", "dbias (bias)"]
    for threads, other in zip((2, 3), runs[1:]):
        for name, one, many in zip(names, runs[0], other):
            assert torch.equal(one, many), (
                f"{act_cls.__name__} {name}: {threads} threads differ from 1")


def test_matches_the_float64_reference():
    x = torch.randn(4, 7, 33, requires_grad=True)
    seq = te.ops.Sequential(te.ops.Bias(33), te.ops.GELU())
    with torch.no_grad():
        seq[0].bias.normal_()
    dy = torch.randn(4, 7, 33)
    seq(x).backward(dy)
    x64 = x.detach().double().requires_grad_()
    b64 = seq[0].bias.detach().double().requires_grad_()
    y64 = ref.gelu(ref.bias(x64, b64))
    y64.backward(dy.double())
    torch.testing.assert_close(seq(x).detach(), y64.float(), rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(seq[0].bias.grad, b64.grad.float(), rtol=1.3e-6, atol=1e-4)


def test_frozen_bias_and_input_not_requiring_grad():
    seq = te.ops.Sequential(te.ops.Bias(8), te.ops.SiLU())
    with torch.no_grad():
        seq[0].bias.normal_()
    seq[0].bias.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=True)
    seq(x).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    ref.silu(x2 + seq[0].bias).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    seq[0].bias.requires_grad_(True)
    y = seq(torch.randn(3, 8))  # only the bias needs a gradient
    y.sum().backward()
    assert seq[0].bias.grad is not None


def test_frozen_bias_runs_the_fused_backward_kernel(monkeypatch):
    """A fused op in the plan is the code that runs: with the bias frozen,
    BackwardActivationBias still makes its one dbias_d<act> call (the dbias is dropped), never
    the activation's or the Bias' own backward; dx equals the float64 reference's."""
    seq = te.ops.Sequential(te.ops.Bias(8), te.ops.GELU())
    seq[0].bias.requires_grad_(False)
    plan, = seq.fusion_plan(torch.randn(3, 8), requires_grad=True)
    assert [type(op).__name__ for op, _ in plan.backward_ops] == ["BackwardActivationBias"]

    def refuse(*args, **kwargs):
        raise AssertionError("an unfused backward ran inside BackwardActivationBias")

    for op in seq:
        monkeypatch.setattr(op, "op_backward", refuse)
    x = torch.randn(3, 8, requires_grad=True)
    dy = torch.randn(3, 8)
    seq(x).backward(dy)
    x64 = x.detach().double().requires_grad_()
    ref.gelu(ref.bias(x64, seq[0].bias.detach().double())).backward(dy.double())
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1.3e-6, atol=1e-5)
    assert seq[0].bias.grad is None


def test_autocast_runs_in_the_autocast_dtype():
    seq = te.ops.Sequential(te.ops.Bias(8), te.ops.GELU())
    x = torch.randn(3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = seq(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and seq[0].bias.grad.dtype == torch.float32
    plan = [type(op) for op, _ in seq._module_groups[0]._forward_ops]
    assert plan == [ForwardBiasActivation]


def test_linear_bias_activation_still_wins():
    seq = te.ops.Sequential(te.ops.Linear(8, 8), te.ops.GELU(), te.ops.Bias(8), te.ops.ReLU())
    seq(torch.randn(2, 8, requires_grad=True)).sum().backward()
    fwd = [type(op).__name__ for op, _ in seq._module_groups[0]._forward_ops]
    assert fwd == ["ForwardLinearBiasActivation", "ForwardBiasActivation"]


def test_not_fused_under_a_quantization_recipe_or_with_cached_fp8_input():
    seq = te.ops.Sequential(te.ops.Bias(32), te.ops.GELU(cache_quantized_input=True))
    seq(torch.randn(2, 32, requires_grad=True))
    assert not any(op.is_fused_op for op, _ in seq._module_groups[0]._forward_ops)
    ops = [te.ops.Bias(4), te.ops.GELU()]
    assert extend_forward_bias_activation(ops, recipe=te.recipe.Float8CurrentScaling()) == ops


def test_saves_the_input_and_bias_not_the_activation_input():
    T, H = 64, 32
    x = torch.randn(T, H, requires_grad=True)
    # the pipeline input and the parameter exist anyway: nothing else is saved (unfused: z)
    assert saved_activation_bytes(te.ops.Sequential(te.ops.Bias(H), te.ops.GELU()), x) == 0
    # after a LayerNorm: its mean and rstd, and its output (the fused op's input) instead of z
    model = te.ops.Sequential(te.ops.LayerNorm(H), te.ops.Bias(H), te.ops.GELU())
    assert saved_activation_bytes(model, x) == 4 * (2 * T + T * H)
    with torch.no_grad():
        assert saved_activation_bytes(te.ops.Sequential(te.ops.Bias(H), te.ops.GELU()), x) == 0


def test_saves_more_without_the_forward_fusion(fusion_registry):
    T, H = 64, 32
    x = torch.randn(T, H, requires_grad=True)
    _without_forward_fusion()
    assert saved_activation_bytes(te.ops.Sequential(te.ops.Bias(H), te.ops.GELU()), x) == 4 * T * H


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_equals_eager_and_keeps_both_fusions(backend):
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch.manual_seed(0)
    seq = te.ops.Sequential(te.ops.Bias(16), te.ops.QGELU())
    with torch.no_grad():
        seq[0].bias.normal_()
    x = torch.randn(2, 5, 16, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    dy = torch.randn(2, 5, 16)
    y = seq(x)
    y.backward(dy)
    db = seq[0].bias.grad.clone()
    seq[0].bias.grad = None
    rec = AotEagerAndRecordGraphs() if backend == "aot_eager" else "inductor"
    yc = torch.compile(seq, backend=rec, fullgraph=True)(xc)
    yc.backward(dy)
    torch.testing.assert_close(yc, y, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, x.grad, rtol=0, atol=0)
    torch.testing.assert_close(seq[0].bias.grad, db, rtol=0, atol=0)
    if backend == "aot_eager":
        fw = "\n".join(g.code for g in rec.fw_graphs)
        bw = "\n".join(g.code for g in rec.bw_graphs)
        assert "te_cpp.bias_act_fwd" in fw and "te_cpp.bias_fwd" not in fw
        assert "te_cpp.dbias_dqgelu" in bw and "te_cpp.bias_bwd" not in bw
