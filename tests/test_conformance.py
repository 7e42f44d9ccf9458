"""Conformance harness: every OpCase in tests/cases.py gets opcheck on its custom ops (fp32,
bf16 and fp16; zero-size and non-contiguous samples for every op), eager numerics against a
float64 reference (fp32, bf16 and fp16; layouts with one, several and zero rows, leading dims,
a non-contiguous input), compiled (fullgraph=True) forward and backward equal to eager with
zero graph breaks, and its bad-input errors. Opcheck, numerics and compiled runs are
parametrized by device: CUDA runs skip without a GPU, and skip naming the op where an op has
no CUDA kernel yet."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._dynamo.utils import counters

from transformer_engine_cpp.ops.basic import ACTIVATIONS

from cases import (CASE_IDS, CONTIGUOUS_ARGUMENTS, ONE_ELEMENT_OPS, OP_CASES,
                   STANDALONE_OPCHECK_SAMPLES, _is_non_contiguous_sample, _is_zero_size_sample,
                   _non_contiguous, _op_name)
from harness import (DEVICES, LAYOUTS, as_tuple, build, clone_leaf, copy_nodes, eager_run,
                     inputs_for, opcheck_sample, random_grads_like, reference_run,
                     skip_missing_cuda_kernel, to_device)
from tolerances import COMPILED_VS_EAGER, tols

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]


def _all_te_cpp_ops() -> set[str]:
    return {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("te_cpp::")}


def _opcheck_cases() -> list:
    """The first case of each distinct opcheck_samples function: cases of one family share
    their samples (the twelve linear cases all use the linear family's; the factories in
    cases.py are cached per configuration), which would otherwise be opchecked once per case."""
    first = {}
    for case in OP_CASES:
        if case.opcheck_samples and case.opcheck_samples not in first:
            first[case.opcheck_samples] = case
    return list(first.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", _opcheck_cases(), ids=lambda c: c.id)
def test_opcheck(case, dtype, device):
    with skip_missing_cuda_kernel():
        for op, args in case.opcheck_samples(dtype):
            opcheck_sample(op, to_device(args, device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("family", sorted(STANDALONE_OPCHECK_SAMPLES))
def test_opcheck_standalone(family, dtype, device):
    with skip_missing_cuda_kernel():
        for op, args in STANDALONE_OPCHECK_SAMPLES[family](dtype):
            opcheck_sample(op, to_device(args, device))


def _all_opcheck_samples(dtype=torch.float32) -> list:
    """Every (custom op, args) opcheck sample: the op cases' and the standalone ones."""
    out, seen = [], set()
    for sample_fn in [c.opcheck_samples for c in OP_CASES if c.opcheck_samples] + \
            list(STANDALONE_OPCHECK_SAMPLES.values()):
        if sample_fn not in seen:  # cases of one family share their samples
            seen.add(sample_fn)
            out += sample_fn(dtype)
    return out


def test_every_custom_op_has_an_opcheck_sample():
    covered = {_op_name(op) for op, _ in _all_opcheck_samples()}
    missing = _all_te_cpp_ops() - covered
    assert not missing, f"custom ops without an opcheck sample: {sorted(missing)}"


def test_every_custom_op_falls_through_autograd():
    """Every te_cpp op has the Autograd fallthrough that csrc/registration.cpp's define()
    registers with its schema: no op is differentiable on its own (an op without it would get
    torch's default autograd fallback, and its outputs a grad_fn)."""
    ops = _all_te_cpp_ops()
    assert ops
    for name in sorted(ops):
        qualified = f"te_cpp::{name}"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Autograd"), name
        table = torch._C._dispatch_dump_table(qualified).splitlines()
        assert any(line.startswith("AutogradCPU: fallthrough") for line in table), name
    x = torch.randn(2, 4, requires_grad=True)
    y = torch.ops.te_cpp.gelu_fwd(x)
    assert y.grad_fn is None and not y.requires_grad


def test_every_custom_op_has_zero_size_and_non_contiguous_samples():
    """Each custom op's samples include one whose input has no elements, and one with
    non-contiguous tensor arguments (CONTIGUOUS_ARGUMENTS lists the arguments an op requires
    contiguous; those are tested to raise below). ONE_ELEMENT_OPS have neither."""
    samples = _all_opcheck_samples()
    ops = _all_te_cpp_ops()
    assert set(ONE_ELEMENT_OPS) <= ops, sorted(set(ONE_ELEMENT_OPS) - ops)
    ops -= set(ONE_ELEMENT_OPS)
    zero = {_op_name(op) for op, args in samples if _is_zero_size_sample(args)}
    non_contiguous = {_op_name(op) for op, args in samples if _is_non_contiguous_sample(args)}
    assert not ops - zero, f"custom ops without a zero-size opcheck sample: {sorted(ops - zero)}"
    assert not ops - non_contiguous, \
        f"custom ops without a non-contiguous opcheck sample: {sorted(ops - non_contiguous)}"
    assert set(CONTIGUOUS_ARGUMENTS) <= ops, sorted(set(CONTIGUOUS_ARGUMENTS) - ops)


def test_contiguous_arguments_reject_non_contiguous_input():
    """An argument an op requires contiguous gets a clear error naming the op when it is not."""
    samples = _all_opcheck_samples()
    for name, arguments in CONTIGUOUS_ARGUMENTS.items():
        args = next(a for op, a in samples if _op_name(op) == name and not
                    _is_zero_size_sample(a) and not _is_non_contiguous_sample(a))
        for index in arguments:
            bad = list(args)
            bad[index] = _non_contiguous(args[index].clone())
            with pytest.raises(RuntimeError, match=rf"te_cpp\.{name}: .*contiguous"):
                getattr(torch.ops.te_cpp, name)(*bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", OP_CASES, ids=CASE_IDS)
def test_numerics_vs_float64_reference(case, dtype, layout, device):
    with skip_missing_cuda_kernel():
        _numerics_vs_float64_reference(case, dtype, layout, device)


def _numerics_vs_float64_reference(case, dtype, layout, device):
    seq = build(case, dtype, device=device)
    x, extras = inputs_for(case, dtype, layout, device=device)
    # Shapes of the outputs, from a no-grad run, to draw the output grads.
    with torch.no_grad():
        probe = as_tuple(seq(clone_leaf(x), *[clone_leaf(e) for e in extras]))
    grads = random_grads_like(probe)
    # Reference first: in-place variants write into the extra input / extra-output grad.
    r_outs, r_dx, r_dextras, r_dparams = reference_run(case, seq, x, extras,
                                                       [g.clone() for g in grads])
    outs, dx, dextras, dparams = eager_run(seq, x, extras, grads)

    tol = tols(dtype)
    assert len(outs) == len(r_outs)
    for out, r in zip(outs, r_outs):
        assert out.dtype == dtype and out.device == x.device
        assert out.shape == r.shape
        torch.testing.assert_close(out.double().cpu(), r, **tol)
    torch.testing.assert_close(dx.double().cpu(), r_dx, **tol)
    for e, d, r in zip(extras, dextras, r_dextras):
        if not e.requires_grad:
            assert d is None and r is None
            continue
        torch.testing.assert_close(d.double().cpu(), r, **tol)
    for name, g in dparams.items():
        assert g is not None and g.dtype == dtype, name
        torch.testing.assert_close(g.double().cpu(), r_dparams[name], **tol,
                                   msg=lambda m: f"{name}: {m}")
    if x.numel() == 0:
        # no rows: the parameter grads are (exact) zeros of the parameters' shapes
        assert dx.shape == x.shape
        for name, p in seq.named_parameters():
            assert dparams[name].shape == p.shape, name
            assert not dparams[name].any(), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OP_CASES, ids=CASE_IDS)
def test_compiled_matches_eager(case, device):
    with skip_missing_cuda_kernel():
        _compiled_matches_eager(case, device)


def _compiled_matches_eager(case, device):
    dtype = torch.float32
    eager = build(case, dtype, device=device)
    compiled_model = build(case, dtype, device=device)
    x, extras = inputs_for(case, dtype, "leading_dims", device=device)
    xc, extras_c = clone_leaf(x), [clone_leaf(e) for e in extras]
    with torch.no_grad():
        probe = as_tuple(eager(clone_leaf(x), *[clone_leaf(e) for e in extras]))
    grads = random_grads_like(probe)

    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(compiled_model, backend=backend, fullgraph=True, dynamic=False)
    outs, dx, dextras, dparams = eager_run(eager, x, extras, [g.clone() for g in grads])
    c_outs = as_tuple(compiled(xc, *extras_c))
    torch.autograd.backward(c_outs, [g.clone() for g in grads])

    assert len(counters["graph_break"]) == 0
    for out, c in zip(outs, c_outs):
        torch.testing.assert_close(c, out, **COMPILED_VS_EAGER)
    torch.testing.assert_close(xc.grad, dx, **COMPILED_VS_EAGER)
    for e, d in zip(extras_c, dextras):
        torch.testing.assert_close(e.grad, d, **COMPILED_VS_EAGER)
    for name, p in compiled_model.named_parameters():
        torch.testing.assert_close(p.grad, dparams[name], **COMPILED_VS_EAGER)

    # One forward and one backward graph; a backward-only fusion is still used compiled.
    assert len(backend.fw_graphs) == 1 and len(backend.bw_graphs) == 1
    # functionalization of our schemas adds no copy of an op's output or input
    for graph in (backend.fw_graphs[0], backend.bw_graphs[0]):
        assert copy_nodes(graph) == [], graph.code
    bw_code = backend.bw_graphs[0].code
    for fused in case.fused_backward:
        fused_ops = {"BackwardActivationBias": "dbias_d", "BackwardAddRMSNorm": "rmsnorm_bwd_add",
                     "BackwardLinearAdd": "linear_dgrad_add",
                     "BackwardLinearScale": "linear_bwd", "BackwardLinearBias": "linear_bwd"}
        assert f"torch.ops.te_cpp.{fused_ops[fused.__name__]}" in bw_code, bw_code
        unfused = {"BackwardActivationBias": "bias_bwd", "BackwardAddRMSNorm": "rmsnorm_bwd(",
                   "BackwardLinearAdd": "make_extra_output_bwd",
                   "BackwardLinearScale": "constant_scale_bwd", "BackwardLinearBias": "bias_bwd"}
        assert unfused[fused.__name__] not in bw_code, bw_code


def _activation_op_names() -> set[str]:
    """The activation family's ops (the rows of csrc/ops/activation_table.h)."""
    stems = {c.op_stem for c in ACTIVATIONS}
    return ({f"{s}_{d}" for s in stems for d in ("fwd", "bwd")} | {f"dbias_d{s}" for s in stems}
            | {"bias_act_fwd"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_activation_ops_match_cpu_and_repeat_bitwise(dtype, device):
    """Every opcheck sample of the activation family on `device` against the same call on the
    CPU (the CPU kernels are checked against float64 above): this reaches the paths the te.ops
    cases do not (dbias_d<act> without a bias, mixed dtypes, zero-size and non-contiguous
    samples). A second run gives the same bits (the dbias and dscales reductions are
    deterministic)."""
    names = _activation_op_names()
    samples = [(op, args) for op, args in _all_opcheck_samples(dtype) if _op_name(op) in names]
    assert {_op_name(op) for op, _ in samples} == names & _all_te_cpp_ops()
    tol = {k: 2 * v for k, v in tols(dtype).items()}
    with skip_missing_cuda_kernel():
        for op, args in samples:
            expected = as_tuple(op(*args))
            got = as_tuple(op(*to_device(args, device)))
            again = as_tuple(op(*to_device(args, device)))
            assert len(got) == len(expected)
            for g, a, e in zip(got, again, expected):
                assert g.device.type == device and g.dtype == e.dtype and g.shape == e.shape, op
                torch.testing.assert_close(g.cpu(), e, **tol, msg=lambda m: f"{op}: {m}")
                assert torch.equal(g, a), f"{op}: two runs differ"


@pytest.mark.parametrize("case", [c for c in OP_CASES if c.bad_inputs], ids=lambda c: c.id)
def test_bad_inputs(case):
    for label, thunk, exc, match in case.bad_inputs:
        with pytest.raises(exc, match=match):
            thunk()
            pytest.fail(f"{case.id}: {label} was accepted")


@pytest.mark.parametrize("case", [c for c in OP_CASES if c.fused_backward or c.fused_forward],
                         ids=lambda c: c.id)
def test_fusion_plan(case):
    seq = build(case, torch.float32)
    x, extras = inputs_for(case, torch.float32, "rows")
    as_tuple(seq(x, *extras))[0].sum().backward()
    fuser = seq._module_groups[0]
    fwd_types = tuple(type(op) for op, _ in fuser._forward_ops if op.is_fused_op)
    bwd_types = tuple(type(op) for op, _ in fuser._backward_ops if op.is_fused_op)
    assert fwd_types == case.fused_forward
    assert bwd_types == case.fused_backward


def test_missing_cuda_kernel_skips_naming_the_op():
    """What a CUDA run does where an op has no CUDA kernel yet: the dispatcher's error becomes
    a skip naming the op; any other NotImplementedError is an error."""
    message = ("Could not run 'te_cpp::gelu_fwd' with arguments from the 'CUDA' backend. This "
               "could be because the operator doesn't exist for this backend")
    with pytest.raises(pytest.skip.Exception, match="te_cpp::gelu_fwd has no CUDA kernel yet"):
        with skip_missing_cuda_kernel():
            raise NotImplementedError(message)
    with pytest.raises(NotImplementedError, match="something else"):
        with skip_missing_cuda_kernel():
            raise NotImplementedError("something else")
    args = (torch.ones(2, requires_grad=True), [torch.zeros(1)], 3.0, "gelu")
    moved = to_device(args, "meta")
    assert moved[0].device.type == "meta" and moved[0].requires_grad
    assert moved[1][0].device.type == "meta" and moved[2:] == (3.0, "gelu")


def test_copy_nodes_finds_the_copies_functionalization_makes():
    """The check above can fail: a function that clones and makes a transpose contiguous
    gives a forward graph with copy nodes."""
    backend = AotEagerAndRecordGraphs()

    def f(x):
        y = (x * 2).clone()
        y.add_(1)
        return y.t().contiguous()

    x = torch.randn(4, 3, requires_grad=True)
    torch.compile(f, backend=backend, fullgraph=True)(x).sum().backward()
    assert len(copy_nodes(backend.fw_graphs[0])) == 2
