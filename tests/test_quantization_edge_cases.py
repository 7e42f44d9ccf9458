"""Edge cases of the quantized tensors, recipe state and recipes (issue 11): dtype conversions,
in-place ops on quantized tensors, torch.inference_mode, delayed scaling of quantized weights,
and the errors of bad shapes and bad recipe fields."""

from __future__ import annotations

import math
import re

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import recipe
from transformer_engine_cpp.quantization import FP8GlobalStateManager, RecipeState

from harness import dequantized

E4M3 = torch.float8_e4m3fn


def re_value(value):
    return re.escape(repr(value))


def _f8(shape=(64, 64), dtype=torch.float16, scale=100.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    return te.Float8CurrentScalingQuantizer(E4M3)(x)


def _mx(shape=(64, 64), dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 100).to(dtype)
    return te.MXFP8Quantizer(E4M3)(x)


# ---- item 4: dtype conversions dequantize to the nominal dtype first -------------------------

_CONVERSIONS = {
    "to(float64)": lambda t: t.to(torch.float64),
    "to(dtype=float64)": lambda t: t.to(dtype=torch.float64),
    "double()": lambda t: t.double(),
    "float()": lambda t: t.float(),
    "to(float32)": lambda t: t.to(torch.float32),
    "type(float64)": lambda t: t.type(torch.float64),
    "half()": lambda t: t.half(),
    "bfloat16()": lambda t: t.bfloat16(),
}


@pytest.mark.parametrize("make", [_f8, _mx], ids=["Float8Tensor", "MXFP8Tensor"])
@pytest.mark.parametrize("nominal", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("conv", list(_CONVERSIONS), ids=list(_CONVERSIONS))
def test_dtype_conversion_equals_dequantize_then_cast(make, nominal, conv):
    t = make(dtype=nominal)
    out = _CONVERSIONS[conv](t)
    if out.dtype == nominal:  # torch's rule: a conversion to the same dtype returns self
        assert out is t
        return
    expected = t.dequantize().to(out.dtype)
    # a plain tensor, as TransformerEngine's default dispatch gives
    assert type(out) is torch.Tensor
    assert torch.equal(out, expected), (out - expected).abs().max()


def test_dtype_conversion_of_fp16_differs_from_relabelling():
    """The case of the report: relabelling fp16 FP8 data as float64 is off by up to ~2e-4
    relative; the conversion must round to fp16 first."""
    t = _f8(dtype=torch.float16)
    direct = torch.ops.te_cpp.fp8_dequantize(t._data, t._scale_inv, E4M3, torch.float64)
    assert not torch.equal(direct, t.dequantize().double())  # the test would catch a relabel
    assert torch.equal(t.to(torch.float64), t.dequantize().double())


def test_module_dtype_cast_still_keeps_quantized_weights():
    """nn.Module casts (model.double(), model.to(dtype)) keep a quantized weight's FP8 buffers
    and change its nominal dtype; only a direct tensor conversion dequantizes."""
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        model = te.ops.Sequential(te.ops.BasicLinear(32, 32, dtype=torch.float16))
    data = model[0].weight._data.clone()
    model.to(torch.float32)
    w = model[0].weight
    assert isinstance(w, te.Float8Tensor) and w.dtype == torch.float32
    assert torch.equal(w._data, data)
    plain = w.double()
    assert type(plain) is torch.Tensor and torch.equal(plain, w.dequantize().double())


@pytest.mark.parametrize("overwrite", [False, True], ids=["set_data", "overwrite"])
def test_module_cast_is_marked_by_the_te_ops_module(overwrite):
    """A te.ops op marks its own casts (BasicOperation._apply), also when a user container
    holding it is cast, so its quantized weights stay quantized whichever way nn.Module
    applies the conversion (``param.data = ...``, or new parameters with
    ``torch.__future__.set_overwrite_module_params_on_conversion(True)``). A quantized
    parameter of another module is converted as a tensor: dequantized."""
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    try:
        with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
            inner = te.ops.Sequential(te.ops.BasicLinear(32, 32, dtype=torch.float16))
        data = inner[0].weight._data.clone()
        torch.nn.ModuleDict({"block": inner}).to(torch.float32)
        w = inner[0].weight
        assert isinstance(w, te.Float8Tensor) and w.dtype == torch.float32
        assert torch.equal(w._data, data)
        if overwrite:
            plain = torch.nn.Linear(32, 32, bias=False)
            f8 = _f8(shape=(32, 32), dtype=torch.float32)
            plain.weight = torch.nn.Parameter(f8, requires_grad=False)
            plain.half()
            assert type(plain.weight.data) is torch.Tensor
            assert torch.equal(plain.weight.data, f8.dequantize().half())
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)


# ---- item 9: in-place ops on quantized tensors ----------------------------------------------


def _fq(x):
    return te.Float8CurrentScalingQuantizer(E4M3)(x).dequantize()


def test_add_extra_input_in_place_into_float8_extra_input():
    """AddExtraInput(in_place=True) writes the sum into the extra input's buffers: a
    Float8Tensor extra input is dequantized, added to and re-quantized in place
    (TransformerEngine's rule for in-place ops on a quantized tensor)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g)
    extra = te.Float8CurrentScalingQuantizer(E4M3)(torch.randn(4, 32, generator=g))
    before = extra.dequantize()
    model = te.ops.Sequential(te.ops.AddExtraInput(in_place=True))
    y = model(x, extra)
    expected = _fq(before + x)
    assert torch.equal(extra.dequantize(), expected)  # the caller's buffers were written
    y_values = dequantized(y)
    assert torch.equal(y_values, expected)


def test_add_extra_input_in_place_under_autocast_with_float8_extra_input():
    g = torch.Generator().manual_seed(2)
    model = te.ops.Sequential(te.ops.BasicLinear(32, 32), te.ops.AddExtraInput(in_place=True))
    x = torch.randn(8, 32, generator=g)
    extra = te.Float8CurrentScalingQuantizer(E4M3)(torch.randn(8, 32, generator=g))
    before = extra.dequantize()
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        with torch.no_grad():
            y_lin = model[0](x)
            y = model(x, extra)
    assert torch.equal(extra.dequantize(), _fq(before + y_lin))
    y_values = dequantized(y)
    assert torch.equal(y_values, extra.dequantize())


@pytest.mark.parametrize("name", ["add_", "mul_", "copy_", "zero_", "clamp_", "out="])
def test_in_place_aten_ops_on_float8_tensor(name):
    t = _f8(dtype=torch.float32, scale=3.0)
    v = t.dequantize()
    other = torch.full_like(v, 0.5)
    ops = {
        "add_": (lambda a: a.add_(other), v + other),
        "mul_": (lambda a: a.mul_(other), v * other),
        "copy_": (lambda a: a.copy_(other), other),
        "zero_": (lambda a: a.zero_(), torch.zeros_like(v)),
        "clamp_": (lambda a: a.clamp_(-1.0, 1.0), v.clamp(-1.0, 1.0)),
        "out=": (lambda a: torch.add(other, other, out=a), other + other),
    }
    fn, values = ops[name]
    ret = fn(t)
    assert ret is t
    assert isinstance(t, te.Float8Tensor)
    assert torch.equal(t.dequantize(), _fq(values))


def test_in_place_op_writes_other_quantized_arguments_too():
    """A plain destination with a quantized source: the destination gets the dequantized
    values and the source is untouched."""
    t = _f8(dtype=torch.float32, scale=3.0)
    data = t._data.clone()
    dst = torch.zeros(t.shape)
    dst.add_(t)
    assert torch.equal(dst, t.dequantize()) and torch.equal(t._data, data)


def test_in_place_op_on_mxfp8_tensor_requantizes_both_copies():
    t = _mx(dtype=torch.float32)
    expected = t.dequantize() + 1.0
    t.add_(1.0)
    assert isinstance(t, te.MXFP8Tensor)
    q = te.MXFP8Quantizer(E4M3)
    fresh = q.quantize_storage(expected, rowwise=True, columnwise=True)
    for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data",
                 "_columnwise_scale_inv"):
        assert torch.equal(getattr(t, name), getattr(fresh, name)), name
    bare = te.MXFP8Tensor(t._rowwise_data, t._rowwise_scale_inv, None, None, E4M3,
                          torch.float32, t.shape)
    with pytest.raises(RuntimeError, match=r"MXFP8Tensor.*add_.*no quantizer"):
        bare.add_(1.0)


def test_in_place_op_on_float8_tensor_without_quantizer_is_refused_clearly():
    t = _f8(dtype=torch.float32)
    bare = te.Float8Tensor(t._data, t._scale_inv, E4M3, torch.float32)
    with pytest.raises(RuntimeError, match=r"Float8Tensor.*mul_.*no quantizer"):
        bare.mul_(2.0)


# ---- item 10: torch.inference_mode -----------------------------------------------------------


@pytest.mark.parametrize("make", [_f8, _mx], ids=["Float8Tensor", "MXFP8Tensor"])
def test_detach_and_alias_inside_inference_mode(make):
    t = make(dtype=torch.float32)
    with torch.inference_mode():
        d = t.detach()
        inner = make(dtype=torch.float32, seed=3)
        d2 = inner.detach()
    assert type(d) is type(t) and torch.equal(d.dequantize(), t.dequantize())
    assert type(d2) is type(inner) and torch.equal(d2.dequantize(), inner.dequantize())
    # as for plain tensors: a detached inference tensor stays one, a normal one stays normal
    d3 = inner.detach()
    assert not d.is_inference() and d2.is_inference() and d3.is_inference()


def test_delayed_scaling_state_built_in_inference_mode_is_trainable():
    with torch.inference_mode():
        state = RecipeState.create(recipe.DelayedScaling(), mode="forward", num_quantizers=2)
    assert not state.scale.is_inference() and not state.amax_history.is_inference()


def _delayed_run(first_pass_context):
    torch.manual_seed(0)
    r = recipe.DelayedScaling(amax_history_len=4)
    model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU(), te.ops.Linear(32, 16))
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(8, 32, generator=g)
    with first_pass_context():
        with te.autocast(recipe=r):
            model(x0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        x = torch.randn(8, 32, generator=g, requires_grad=True)
        with te.autocast(recipe=r):
            y = model(x)
        loss = y.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses, [p.detach().clone() for p in model.parameters()], model


def test_model_run_under_inference_mode_then_trained_matches_no_grad():
    """A first pass under torch.inference_mode builds the DelayedScaling state; training must
    then run and give exactly what a first pass under torch.no_grad gives."""
    losses_i, params_i, model_i = _delayed_run(torch.inference_mode)
    losses_n, params_n, _ = _delayed_run(torch.no_grad)
    for a, b in zip(losses_i, losses_n):
        assert torch.equal(a, b)
    for a, b in zip(params_i, params_n):
        assert torch.equal(a, b)
    states = [m._fp8_metas[mode] for m in model_i.modules()
              if getattr(m, "_fp8_metas", None) for mode in ("forward", "backward")
              if mode in m._fp8_metas]
    assert states and all(not s.scale.is_inference() and not s.amax_history.is_inference()
                          for s in states)


# ---- errors -----------------------------------------------------------------------------------


def test_mxfp8_columnwise_error_names_user_shape():
    op = te.ops.BasicLinear(64, 64)
    x = torch.randn(40, 64, requires_grad=True)
    with pytest.raises((RuntimeError, ValueError)) as info:
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            op(x)
    msg = str(info.value)
    assert "(40, 64)" in msg and "[64, 40]" not in msg and "(64, 40)" not in msg, msg
    assert "multiples of 32" in msg


def test_mxfp8_rowwise_error_names_user_shape():
    op = te.ops.BasicLinear(40, 64)
    x = torch.randn(64, 40)
    with pytest.raises((RuntimeError, ValueError)) as info:
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            op(x)
    msg = str(info.value)
    assert "(64, 40)" in msg and "multiple of 32" in msg, msg


def test_mxfp8_quantizer_errors_name_user_shape():
    q = te.MXFP8Quantizer(E4M3)
    with pytest.raises(ValueError, match=r"MXFP8Quantizer.*multiple of 32.*\(64, 40\)"):
        q(torch.randn(64, 40))
    with pytest.raises(ValueError, match=r"MXFP8Quantizer.*multiples of 32.*\(40, 64\)"):
        q(torch.randn(40, 64))


def test_mxfp8_quantize_in_ops_names_the_op_and_user_shape():
    q = te.MXFP8Quantizer(E4M3)
    with pytest.raises(ValueError, match=r"^BasicLinear: columnwise .*\(40, 64\)"):
        q.quantize_storage(torch.randn(40, 64), columnwise=True, op="BasicLinear")
    with pytest.raises(ValueError, match=r"^MXFP8BlockScaling: MXFP8 needs .*\(8, 40\)"):
        q.quantize_storage(torch.randn(8, 40))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), -1e-3, True])
def test_qparams_amax_epsilon_refused(value):
    with pytest.raises(ValueError, match=r"QParams: amax_epsilon .*" + re_value(value)):
        recipe.QParams(amax_epsilon=value)


def test_qparams_power_2_scale_must_be_bool():
    with pytest.raises(ValueError, match=r"QParams: power_2_scale .* 1"):
        recipe.QParams(power_2_scale=1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_current_scaling_quantizer_amax_epsilon_refused(value):
    with pytest.raises(ValueError, match=r"Float8CurrentScalingQuantizer: amax_epsilon"):
        te.Float8CurrentScalingQuantizer(E4M3, amax_epsilon=value)


@pytest.mark.parametrize("cls,field,value", [
    (recipe.DelayedScaling, "reduce_amax", 1),
    (recipe.DelayedScaling, "fp8_dpa", "yes"),
    (recipe.DelayedScaling, "fp8_mha", None),
    (recipe.DelayedScaling, "scaling_factor_compute_algo", "max"),
    (recipe.DelayedScaling, "margin", float("nan")),
    (recipe.DelayedScaling, "amax_history_len", 2.0),
    (recipe.Float8CurrentScaling, "fp8_dpa", 1),
    (recipe.Float8CurrentScaling, "fp8_mha", "no"),
    (recipe.MXFP8BlockScaling, "fp8_dpa", 0),
    (recipe.MXFP8BlockScaling, "fp8_mha", None),
    (recipe.MXFP8BlockScaling, "enable_2d_quantization", "no"),
])
def test_recipe_fields_validated(cls, field, value):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: {field} .*{re_value(value)}"):
        cls(**{field: value})


# ---- item 5: quantized weights under DelayedScaling get new scales ---------------------------


def _fq_delayed(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Independent delayed-scaling cast: data = e4m3(clamp(x * scale)), value = data / scale,
    in fp32."""
    s = scale.reshape(()).float()
    data = torch.clamp(x.float() * s, -448.0, 448.0).to(E4M3)
    return data.float() * (1.0 / s)


def _delayed_scale(amax: float) -> torch.Tensor:
    return torch.tensor(448.0, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)


def test_delayed_scaling_quantized_tensor_requantizes_with_updated_scale():
    """The mechanism: a Float8Tensor whose quantizer is a delayed-scaling quantizer of a
    registered state records its amax on every in-place update; the outermost autocast exit
    updates the scale; the next update uses it. A weight of 1000 first saturates to 448 (scale
    1), then is exact after one update."""
    r = recipe.DelayedScaling(amax_history_len=2)
    state = RecipeState.create(r, mode="forward", num_quantizers=2)
    q = state.make_quantizers()[1]
    w = q(torch.zeros(4, 8))
    master = torch.full((4, 8), 1000.0)
    expected_scale = torch.ones(())
    for step, (value, amax_after) in enumerate([(1000.0, 1000.0), (1000.0, 1000.0),
                                                (125.0, 1000.0), (125.0, 125.0)]):
        master.fill_(value)
        w.copy_(master)
        assert torch.equal(w.dequantize(), _fq_delayed(master, expected_scale)), step
        FP8GlobalStateManager.add_delayed_scaling_state(state)
        with te.autocast(recipe=r):
            pass
        expected_scale = _delayed_scale(amax_after)
        assert torch.equal(state.scale[1], expected_scale), (step, state.scale)
    w.copy_(master)
    assert torch.equal(w.dequantize(), _fq_delayed(master, _delayed_scale(125.0)))


def test_update_quantizer_checks_and_carries_the_recorded_amax():
    r = recipe.DelayedScaling()
    init_state = RecipeState.create(r, mode="forward", num_quantizers=2)
    w = init_state.make_quantizers()[1](torch.full((2, 4), 1000.0))
    op_state = RecipeState.create(r, mode="forward", num_quantizers=2)
    q = op_state.make_quantizers()[1]
    w.update_quantizer(q)
    assert w._quantizer is q and op_state.amax_history[0, 1] == 1000.0
    with pytest.raises(ValueError, match=r"Float8Tensor.update_quantizer: .*float8_e4m3fn"):
        w.update_quantizer(te.Float8CurrentScalingQuantizer(torch.float8_e5m2))
    with pytest.raises(ValueError, match=r"Float8Tensor.update_quantizer"):
        w.update_quantizer(te.MXFP8Quantizer(E4M3))


def test_quantized_weight_under_delayed_scaling_gets_new_scales():
    """te.quantized_model_init(DelayedScaling): the weight is re-quantized by its updates with
    the op's weight quantizer, so the weight's amax enters the op's history and the scale of
    the next update is 448 / amax (TransformerEngine: BasicLinear points weight._quantizer at
    its forward quantizer 1). Master-weight loop: the high-precision master is copied into the
    FP8 weight after each step."""
    r = recipe.DelayedScaling(amax_history_len=2)
    with te.quantized_model_init(recipe=r):
        op = te.ops.BasicLinear(32, 32)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(7))
    master = torch.empty(32, 32)
    expected_scale = torch.ones(())
    seen = []
    for step, (value, amax_after) in enumerate([(1000.0, 1000.0), (1000.0, 1000.0),
                                                (125.0, 1000.0), (125.0, 125.0)]):
        master.fill_(value)
        with torch.no_grad():
            op.weight.copy_(master)
        w = op.weight.dequantize()
        assert torch.equal(w, _fq_delayed(master, expected_scale)), step
        seen.append(w[0, 0].item())
        with te.autocast(recipe=r):
            op(x)
        expected_scale = _delayed_scale(amax_after)
        assert torch.equal(op._fp8_metas["forward"].scale[1], expected_scale), step
    # 1000 saturates at scale 1 (448), then is represented once the scale is 448 / 1000
    assert seen[0] == 448.0
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(seen[1:], (1000.0, 125.0, 125.0)))
    # the scale follows the weight's amax down once 1000 leaves the 2-step history
    assert torch.equal(op._fp8_metas["forward"].scale[1], _delayed_scale(125.0))



@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_fp8_quantize_op_refuses_non_finite_amax_epsilon(value):
    with pytest.raises(ValueError, match=r"te_cpp.fp8_quantize: amax_epsilon must be >= 0 and "
                                         r"finite, got " + ("nan" if value != value else "inf")):
        torch.ops.te_cpp.fp8_quantize(torch.randn(4, 32), E4M3, False, value)


def test_mxfp8_shape_error_in_basic_linear_names_the_op():
    op = te.ops.BasicLinear(64, 64)
    with pytest.raises(ValueError, match=r"^BasicLinear: columnwise .*\(40, 64\)"):
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            op(torch.randn(40, 64, requires_grad=True))
    with pytest.raises(ValueError, match=r"^BasicLinear: MXFP8 needs .*\(64, 40\)"):
        with te.autocast(recipe=recipe.MXFP8BlockScaling()):
            te.ops.BasicLinear(40, 64)(torch.randn(64, 40))


def _buffer_cases():
    """(label, call, error regex) for a bad raw-buffer argument of each quantized-tensor op."""
    ops = torch.ops.te_cpp
    f32 = torch.float32
    x = torch.randn(4, 64)
    data, si, _ = ops.fp8_quantize(x, E4M3, False, 0.0)
    w, wsi, _ = ops.fp8_quantize(torch.randn(32, 64), E4M3, False, 0.0)
    mx, sc = ops.mxfp8_quantize(x, E4M3)
    mw, mwsc = ops.mxfp8_quantize(torch.randn(32, 64), E4M3)
    bd, bs = ops.fp8_block_quantize(x, E4M3, 1, False, 0.0)
    nd, ns, na = ops.nvfp4_quantize(x, False, False, None)
    splits = torch.tensor([1, 3])
    gd, gsi, _ = ops.grouped_fp8_quantize(x, splits, None, E4M3, False, [0.0, 0.0])
    gw = [w, w]
    gwsi = [wsi, wsi]

    def grouped_linear(weights=gw, scale_invs=gwsi):
        return ops.grouped_fp8_linear_fwd(gd, gsi, E4M3, splits, weights, scale_invs, E4M3, [],
                                          None, f32)

    return [
        ("fp8 data", lambda: ops.fp8_dequantize(x, si, E4M3, f32),
         r"te_cpp\.fp8_dequantize: data must be uint8 \(raw FP8 bytes\), got Float"),
        ("fp8 scale_inv dtype", lambda: ops.fp8_dequantize(data, si.double(), E4M3, f32),
         r"te_cpp\.fp8_dequantize: scale_inv must be float32, got Double"),
        ("fp8 scale_inv shape", lambda: ops.fp8_dequantize(data, torch.ones(2), E4M3, f32),
         r"te_cpp\.fp8_dequantize: scale_inv must have shape \[1\], got \[2\]"),
        ("fp8_quantize_scaled scale", lambda: ops.fp8_quantize_scaled(x, si.double(), E4M3),
         r"te_cpp\.fp8_quantize_scaled: scale must be float32, got Double"),
        ("mxfp8 data", lambda: ops.mxfp8_dequantize(mx.to(torch.int8), sc, E4M3, f32),
         r"te_cpp\.mxfp8_dequantize: data must be uint8 \(raw FP8 bytes\), got Char"),
        ("mxfp8 scale", lambda: ops.mxfp8_dequantize(mx, sc.float(), E4M3, f32),
         r"te_cpp\.mxfp8_dequantize: scale_e8m0 must be uint8 \(biased E8M0 exponents\), "
         r"got Float"),
        ("block data", lambda: ops.fp8_block_dequantize(bd.to(torch.int8), bs, E4M3, 1, f32),
         r"te_cpp\.fp8_block_dequantize: data must be uint8 \(raw FP8 bytes\), got Char"),
        ("block scale_inv", lambda: ops.fp8_block_dequantize(bd, bs.double(), E4M3, 1, f32),
         r"te_cpp\.fp8_block_dequantize: scale_inv must be float32, got Double"),
        ("nvfp4 data", lambda: ops.nvfp4_dequantize(nd.to(torch.int16), ns, na, False, f32),
         r"te_cpp\.nvfp4_dequantize: data must be uint8 \(two E2M1 codes per byte\), got Short"),
        ("nvfp4 scale", lambda: ops.nvfp4_dequantize(nd, ns.float(), na, False, f32),
         r"te_cpp\.nvfp4_dequantize: scale_e4m3 must be uint8 \(E4M3 bytes\), got Float"),
        ("nvfp4 amax dtype", lambda: ops.nvfp4_dequantize(nd, ns, na.double(), False, f32),
         r"te_cpp\.nvfp4_dequantize: amax must be float32, got Double"),
        ("nvfp4 amax shape", lambda: ops.nvfp4_dequantize(nd, ns, torch.ones(1, 1), False, f32),
         r"te_cpp\.nvfp4_dequantize: amax must have shape \[1\], got \[1, 1\]"),
        ("fp8_gemm b", lambda: ops.fp8_gemm(data, si, E4M3, w.float(), wsi, E4M3, f32),
         r"te_cpp\.fp8_gemm: b must be uint8 \(raw FP8 bytes\), got Float"),
        ("fp8_gemm scale shape", lambda: ops.fp8_gemm(data, si, E4M3, w, torch.ones(1, 1),
                                                      E4M3, f32),
         r"te_cpp\.fp8_gemm: b_scale_inv must have shape \[1\], got \[1, 1\]"),
        ("mxfp8_gemm scale", lambda: ops.mxfp8_gemm(mx, sc.float(), E4M3, mw, mwsc, E4M3, f32),
         r"te_cpp\.mxfp8_gemm: a_scale must be uint8 \(E8M0 exponents\), got Float"),
        ("grouped data", lambda: ops.grouped_fp8_dequantize(x, splits, gsi, E4M3, f32),
         r"te_cpp\.grouped_fp8_dequantize: data must be uint8 \(raw FP8 bytes\), got Float"),
        ("grouped weight", lambda: grouped_linear(weights=[w, w.float()]),
         r"te_cpp\.grouped_fp8_linear_fwd: weights\[1\] must be uint8 \(raw FP8 bytes\), "
         r"got Float"),
        ("grouped weight scale dtype", lambda: grouped_linear(scale_invs=[wsi.double(), wsi]),
         r"te_cpp\.grouped_fp8_linear_fwd: weight_scale_invs\[0\] must be float32, got Double"),
        ("grouped weight scale shape", lambda: grouped_linear(scale_invs=[wsi, torch.ones(2)]),
         r"te_cpp\.grouped_fp8_linear_fwd: weight_scale_invs\[1\] must have shape \[1\], "
         r"got \[2\]"),
        ("delayed scaling scale",
         lambda: ops.fp8_delayed_scaling_update(torch.ones(2, 3), torch.ones(3).double(), 448.0,
                                                0, "max"),
         r"te_cpp\.fp8_delayed_scaling_update: scale must be float32, got Double"),
    ]


@pytest.mark.parametrize("label,call,message", _buffer_cases(),
                         ids=[c[0] for c in _buffer_cases()])
def test_quantized_buffer_arguments_are_checked(label, call, message):
    """Every raw buffer of the quantized-tensor ops (FP8 / FP4 bytes, E8M0 / E4M3 scale bytes,
    fp32 scales and amaxes) is checked by the shared helpers of csrc/common/common.h: the error
    names the op, the argument, what it must be and what it got."""
    with pytest.raises(RuntimeError, match=message):
        call()
