"""Recipes, quantizers, Float8Tensor / MXFP8Tensor, autocast state and delayed scaling."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import recipe
from transformer_engine_cpp.quantization import (DelayedScalingRecipeState, FP8GlobalStateManager,
                                                 Float8TensorStorage, MXFP8Tensor, RecipeState,
                                                 update_delayed_scaling)

te_ops = torch.ops.te_cpp


def bits(t):
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


# ---- recipes -----------------------------------------------------------------------------------


def test_format_maxima():
    assert (recipe.Format.E4M3.max_fwd, recipe.Format.E4M3.max_bwd) == (448, 448)
    assert (recipe.Format.E5M2.max_fwd, recipe.Format.E5M2.max_bwd) == (57344, 57344)
    assert (recipe.Format.HYBRID.max_fwd, recipe.Format.HYBRID.max_bwd) == (448, 57344)


def test_recipe_defaults_and_predicates():
    d = recipe.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo, d.reduce_amax,
            d.backward_override) == (0, recipe.Format.HYBRID, 1024, "max", True, None)
    c = recipe.Float8CurrentScaling()
    assert c.fp8_format == recipe.Format.HYBRID and c.use_power_2_scales is False
    assert c.fp8_quant_fwd_inp == recipe.QParams() == recipe.QParams(False, 0.0)
    m = recipe.MXFP8BlockScaling()
    assert (m.margin, m.fp8_format, m.backward_override) == (0, recipe.Format.E4M3, None)
    table = [(d, (True, False, True, False)), (c, (False, True, True, False)),
             (m, (False, False, False, True))]
    for r, (delayed, current, per_tensor, mx) in table:
        assert isinstance(r, recipe.Recipe)
        assert (r.delayed(), r.float8_current_scaling(), r.float8_per_tensor_scaling(),
                r.mxfp8()) == (delayed, current, per_tensor, mx)
        assert not (r.float8_block_scaling() or r.nvfp4() or r.custom())
    assert recipe.Float8CurrentScaling(use_power_2_scales=True).fp8_quant_bwd_grad.power_2_scale


@pytest.mark.parametrize("cls", [recipe.DelayedScaling, recipe.Float8CurrentScaling,
                                 recipe.MXFP8BlockScaling])
def test_recipe_validation(cls):
    name = cls.__name__
    with pytest.raises(ValueError, match=f"{name}: pure E5M2"):
        cls(fp8_format=recipe.Format.E5M2)
    with pytest.raises(ValueError, match=f"{name}: backward_override.*'bogus'"):
        cls(backward_override="bogus")
    with pytest.raises(ValueError, match=f"{name}: fp8_format"):
        cls(fp8_format="E4M3")
    if cls is not recipe.DelayedScaling:
        for value in (None, "high_precision", "dequantized"):
            assert cls(backward_override=value).backward_override == value


def test_recipe_field_validation():
    with pytest.raises(ValueError, match="DelayedScaling: margin.*-1"):
        recipe.DelayedScaling(margin=-1)
    with pytest.raises(ValueError, match="DelayedScaling: amax_history_len.*0"):
        recipe.DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="DelayedScaling: amax_compute_algo.*'mean'"):
        recipe.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="DelayedScaling: backward_override is not supported"):
        recipe.DelayedScaling(backward_override="dequantized")
    with pytest.raises(ValueError, match="QParams: amax_epsilon.*-0.5"):
        recipe.QParams(amax_epsilon=-0.5)
    with pytest.raises(ValueError, match="Float8CurrentScaling: fp8_quant_fwd_inp"):
        recipe.Float8CurrentScaling(fp8_quant_fwd_inp=1.0)


# ---- availability ------------------------------------------------------------------------------


def test_availability():
    assert te.is_fp8_available() is True and te.is_mxfp8_available() is True
    ok, reason = te.is_fp8_available(return_reason=True)
    assert ok and "emulated" in reason
    assert te.is_mxfp8_available(return_reason=True)[0] and te.is_bf16_available()


# ---- quantizers and tensors --------------------------------------------------------------------


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_current_scaling_quantizer_round_trip(fp8_dtype, dtype):
    x = torch.randn(6, 40, dtype=dtype)
    q = te.Float8CurrentScalingQuantizer(fp8_dtype, force_pow_2_scales=True, amax_epsilon=0.1)
    t = q(x)
    assert isinstance(t, te.Float8Tensor) and isinstance(t, te.QuantizedTensor)
    assert t.dtype == dtype and t.shape == x.shape and t._fp8_dtype == fp8_dtype
    data, scale_inv, _ = te_ops.fp8_quantize(x, fp8_dtype, True, 0.1)
    assert torch.equal(t._data, data) and torch.equal(bits(t._scale_inv), bits(scale_inv))
    assert t._data.dtype == torch.uint8 and t._scale_inv.shape == (1,)
    y = t.dequantize()
    assert y.dtype == dtype and type(y) is torch.Tensor
    ref = (data.view(fp8_dtype).float() * scale_inv).to(dtype)
    assert torch.equal(bits(y), bits(ref))
    assert t.dequantize(dtype=torch.float64).dtype == torch.float64


def test_float8_tensor_dispatch():
    x = torch.randn(4, 8)
    t = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(x)
    deq = t.dequantize()
    # ops the subclass does not handle run on the dequantized tensor
    assert type(t + 1) is torch.Tensor and torch.equal(t + 1, deq + 1)
    assert torch.equal(t @ x.t(), deq @ x.t())
    assert torch.equal(torch.nn.functional.gelu(t), torch.nn.functional.gelu(deq))
    assert torch.equal(t.sum(), deq.sum())
    # detach / clone / view keep the FP8 buffers
    for u in (t.detach(), t.clone(), t.view(2, 16), t.view(-1)):
        assert isinstance(u, te.Float8Tensor)
        assert torch.equal(u.dequantize().reshape(-1), deq.reshape(-1))
    assert t.detach()._data.data_ptr() == t._data.data_ptr()
    assert t.clone()._data.data_ptr() != t._data.data_ptr()
    assert t.view(2, 16)._data.shape == (2, 16)
    assert "Float8Tensor" in repr(t)


def test_quantizer_straight_through_gradient():
    x = torch.randn(3, 32, requires_grad=True)
    t = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(x)
    assert t.requires_grad
    g = torch.randn(3, 32)
    t.dequantize().backward(g)
    assert torch.equal(x.grad, g)


def test_internal_quantizer_returns_storage():
    q = te.Float8CurrentScalingQuantizer(torch.float8_e5m2)
    q.internal = True
    s = q(torch.randn(5, 7))
    assert isinstance(s, Float8TensorStorage) and not isinstance(s, torch.Tensor)
    assert s.dequantize().shape == (5, 7)


def test_quantizer_set_usage_and_errors():
    q = te.MXFP8Quantizer(torch.float8_e4m3fn)
    assert q.rowwise_usage and q.columnwise_usage
    q.set_usage(columnwise=False)
    assert q.rowwise_usage and not q.columnwise_usage
    with pytest.raises(ValueError, match="fp8_dtype must be torch.float8_e4m3fn"):
        te.Float8CurrentScalingQuantizer(torch.float16)
    with pytest.raises(ValueError, match="MXFP8Quantizer: columnwise usage needs"):
        te.MXFP8Quantizer(torch.float8_e4m3fn)(torch.randn(3, 64))
    with pytest.raises(TypeError, match="high-precision floating"):
        te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(torch.ones(3, dtype=torch.int64))


def test_mxfp8_quantizer_rowwise_and_columnwise():
    x = torch.randn(64, 96)
    t = te.MXFP8Quantizer(torch.float8_e4m3fn)(x)
    assert isinstance(t, MXFP8Tensor) and t.shape == x.shape
    d, s = te_ops.mxfp8_quantize(x, torch.float8_e4m3fn)
    assert torch.equal(t._rowwise_data, d) and torch.equal(t._rowwise_scale_inv, s)
    dc, sc = te_ops.mxfp8_quantize(x.t().contiguous(), torch.float8_e4m3fn)
    assert torch.equal(t._columnwise_data, dc) and torch.equal(t._columnwise_scale_inv, sc)
    assert torch.equal(t.dequantize(),
                       te_ops.mxfp8_dequantize(d, s, torch.float8_e4m3fn, torch.float32))
    t.update_usage(rowwise_usage=False)
    assert torch.equal(t.dequantize(),
                       te_ops.mxfp8_dequantize(dc, sc, torch.float8_e4m3fn, torch.float32).t())
    with pytest.raises(RuntimeError, match="cannot be rebuilt"):
        t.update_usage(rowwise_usage=True)
    assert torch.equal(t + 0, t.dequantize())


# ---- delayed scaling ---------------------------------------------------------------------------


def test_float8_quantizer_uses_scale_and_records_amax():
    scale = torch.tensor([4.0])
    amax = torch.zeros(1)
    q = te.Float8Quantizer(scale, amax, torch.float8_e4m3fn)
    x = torch.randn(5, 9)
    t = q(x)
    data, scale_inv, _ = te_ops.fp8_quantize_scaled(x, scale, torch.float8_e4m3fn)
    assert torch.equal(t._data, data) and t._scale_inv.item() == 0.25
    assert amax.item() == x.abs().max().item()
    q(x * 0.5)  # a smaller amax does not lower the running max
    assert amax.item() == x.abs().max().item()
    q(x * 3)
    assert amax.item() == (x * 3).abs().max().item()


def test_recipe_state_quantizer_types_and_dtypes():
    fwd = RecipeState.create(recipe.Float8CurrentScaling(), mode="forward", num_quantizers=3)
    bwd = RecipeState.create(recipe.Float8CurrentScaling(), mode="backward", num_quantizers=2)
    assert [q.dtype for q in fwd.make_quantizers()] == [torch.float8_e4m3fn] * 3
    assert [q.dtype for q in bwd.make_quantizers()] == [torch.float8_e5m2] * 2
    r = recipe.Float8CurrentScaling(use_power_2_scales=True,
                                    fp8_quant_fwd_weight=recipe.QParams(amax_epsilon=0.5))
    qs = RecipeState.create(r, mode="forward", num_quantizers=3).make_quantizers()
    assert all(q.force_pow_2_scales for q in qs)
    assert [q.amax_epsilon for q in qs] == [0.0, 0.5, 0.0]
    e4 = RecipeState.create(recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3),
                            mode="backward", num_quantizers=1)
    assert e4.make_quantizers()[0].dtype == torch.float8_e4m3fn
    mx = RecipeState.create(recipe.MXFP8BlockScaling(), mode="backward", num_quantizers=2)
    assert all(isinstance(q, te.MXFP8Quantizer) and q.dtype == torch.float8_e4m3fn
               for q in mx.make_quantizers())
    d = RecipeState.create(recipe.DelayedScaling(amax_history_len=4), mode="forward",
                           num_quantizers=3)
    assert isinstance(d, DelayedScalingRecipeState)
    assert d.scale.shape == (3,) and d.amax_history.shape == (4, 3)
    assert all(isinstance(q, te.Float8Quantizer) for q in d.make_quantizers())
    with pytest.raises(ValueError, match="mode must be"):
        RecipeState.create(recipe.DelayedScaling(), mode="sideways")


def test_fp8_scale_update_margin_hybrid():
    """As TransformerEngine's test_fp8_scale_update: HYBRID, margin 2: (448/amax)/4 forward for
    x and w, (57344/amax)/4 backward for dy."""
    r = recipe.DelayedScaling(margin=2, amax_history_len=3, fp8_format=recipe.Format.HYBRID)
    fwd = RecipeState.create(r, mode="forward", num_quantizers=2)
    bwd = RecipeState.create(r, mode="backward", num_quantizers=1)
    qx, qw = fwd.make_quantizers()
    (qdy,) = bwd.make_quantizers()
    x, w, dy = torch.randn(4, 8), torch.randn(8, 8) * 3, torch.randn(4, 8) * 0.01
    qx(x), qw(w), qdy(dy)
    assert fwd.amax_history[0].tolist() == [x.abs().max().item(), w.abs().max().item()]
    update_delayed_scaling(fwd)
    update_delayed_scaling(bwd)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    exp_x = (f32(448.0) / x.abs().max()) / 4
    exp_w = (f32(448.0) / w.abs().max()) / 4
    exp_dy = (f32(57344.0) / dy.abs().max()) / 4
    assert torch.equal(fwd.scale, torch.stack([exp_x, exp_w]))
    assert torch.equal(bwd.scale, exp_dy.reshape(1))
    # history rolled: the recorded amaxes moved to the end, slot 0 zeroed
    assert fwd.amax_history[0].tolist() == [0.0, 0.0]
    assert fwd.amax_history[-1].tolist() == [x.abs().max().item(), w.abs().max().item()]
    # a second step with a smaller x: "max" keeps the larger amax from the history
    qx(x * 0.1)
    update_delayed_scaling(fwd)
    assert torch.equal(fwd.scale[0], exp_x)
    # the new scale is used by the next cast
    assert qx(x)._scale_inv.item() == torch.reciprocal(fwd.scale[0]).item()


def test_nan_in_a_tensor_is_skipped_by_its_amax():
    """As TransformerEngine (its amax kernels reduce with fmaxf): a NaN element quantizes to NaN
    and the scale comes from the finite values, under current scaling (this tensor's amax) and
    delayed scaling (the amax recorded into the history, hence the next scale)."""
    x = torch.randn(16, 64) * 3
    x[3, 7] = float("nan")
    xz = torch.where(torch.isnan(x), torch.zeros(()), x)
    a = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(x)
    b = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(xz)
    assert torch.equal(a._scale_inv, b._scale_inv) and a._scale_inv.item() != 1.0
    da, db = a.dequantize(), b.dequantize()
    assert torch.isnan(da[3, 7]) and torch.isnan(da).sum() == 1
    assert torch.equal(da.nan_to_num(0.0), db)
    r = recipe.DelayedScaling(amax_history_len=2)
    s = RecipeState.create(r, mode="forward", num_quantizers=1)
    (q,) = s.make_quantizers()
    q(x)
    assert s.amax_history[0, 0].item() == xz.abs().max().item()
    update_delayed_scaling(s)
    assert s.scale[0].item() == (torch.tensor(448.0) / xz.abs().max()).item()


def test_fp8_scale_update_special_amax():
    r = recipe.DelayedScaling(amax_history_len=1, amax_compute_algo="most_recent")
    s = RecipeState.create(r, mode="forward", num_quantizers=4)
    s.scale.copy_(torch.tensor([2.0, 3.0, 5.0, 7.0]))
    s.amax_history[0] = torch.tensor([0.0, float("inf"), float("nan"), 1e-45])
    update_delayed_scaling(s)
    # amax 0 / inf / NaN keep the old scale; 448 / 1e-45 overflows: FLT_MAX
    assert s.scale.tolist()[:3] == [2.0, 3.0, 5.0]
    assert s.scale[3].item() == torch.finfo(torch.float32).max
    assert s.amax_history.tolist() == [[0.0, 0.0, 0.0, 0.0]]


# ---- autocast ----------------------------------------------------------------------------------


def test_autocast_state_and_nesting():
    M = FP8GlobalStateManager
    assert not M.is_fp8_enabled()
    assert isinstance(M.get_fp8_recipe(), recipe.Float8CurrentScaling)  # the CPU default
    mx = recipe.MXFP8BlockScaling()
    with te.autocast():
        assert M.is_fp8_enabled() and isinstance(M.get_fp8_recipe(), recipe.Float8CurrentScaling)
        with te.autocast(recipe=mx, amax_reduction_group="g"):
            assert M.get_fp8_recipe() is mx and M.get_fp8_group() == "g"
            with te.autocast(enabled=False):
                assert not M.is_fp8_enabled()
            assert M.is_fp8_enabled() and M.get_fp8_recipe() is mx
        assert M.get_fp8_recipe() is not mx and M.get_fp8_group() is None
    assert not M.is_fp8_enabled() and M.get_autocast_depth() == 0
    with te.autocast(calibrating=True, enabled=False):
        assert M.is_fp8_calibration() and not M.is_fp8_enabled()
    with pytest.raises(KeyError):
        with te.autocast(recipe=mx):
            raise KeyError("boom")
    assert not M.is_fp8_enabled() and M.FP8_RECIPE is None
    with te.fp8_autocast(fp8_recipe=mx):
        assert M.get_fp8_recipe() is mx
    with pytest.raises(ValueError, match="autocast: recipe must be"):
        with te.autocast(recipe="delayed"):
            pass


def test_autocast_exit_updates_delayed_scaling():
    r = recipe.DelayedScaling(amax_history_len=2)
    s = RecipeState.create(r, mode="forward", num_quantizers=1)
    (q,) = s.make_quantizers()
    x = torch.randn(8) * 5
    with te.autocast(recipe=r):
        with te.autocast(recipe=r):
            FP8GlobalStateManager.add_delayed_scaling_state(s)
            q(x)
        assert s.scale.item() == 1.0  # inner exit: no update yet
    expected = (torch.tensor(448.0) / x.abs().max()).item()
    assert s.scale.item() == expected


def test_quantized_model_init_flag():
    M = FP8GlobalStateManager
    assert not M.with_fp8_parameters()
    r = recipe.MXFP8BlockScaling()
    with te.quantized_model_init(recipe=r):
        assert M.with_fp8_parameters() and M.get_fp8_model_init_recipe() is r
        with te.quantized_model_init(enabled=False):
            assert not M.with_fp8_parameters()
        assert M.with_fp8_parameters()
    assert not M.with_fp8_parameters() and M.get_fp8_model_init_recipe() is None


# ---- the storage form: the one representation of a quantized operand ---------------------------


def _quantizers():
    return {
        "current": lambda: te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn),
        "delayed": lambda: te.Float8Quantizer(torch.tensor([3.0]), torch.zeros(1),
                                              torch.float8_e5m2),
        "mxfp8": lambda: te.MXFP8Quantizer(torch.float8_e4m3fn),
    }


@pytest.mark.parametrize("usage", ["row", "col", "both"])
@pytest.mark.parametrize("name", list(_quantizers()))
def test_storage_saves_plain_buffers_and_rebuilds(name, usage):
    """quantize_storage gives the storage form; buffers() are plain tensors (or None),
    metadata() constants only, and from_buffers rebuilds a storage that dequantizes to the
    same bits, rowwise, columnwise and in the nominal dtype."""
    from transformer_engine_cpp.quantization.tensor import QuantizedTensorStorage

    q = _quantizers()[name]()
    x = torch.randn(2, 32, 64, dtype=torch.bfloat16)
    s = q.quantize_storage(x, rowwise=usage != "col", columnwise=usage != "row")
    assert isinstance(s, QuantizedTensorStorage) and not isinstance(s, torch.Tensor)
    assert s.nominal_dtype == torch.bfloat16 and tuple(s.shape) == (2, 32, 64)
    buffers, meta = s.buffers(), s.metadata()
    assert len(buffers) == 4
    assert all(b is None or type(b) is torch.Tensor for b in buffers)
    assert not any(isinstance(m, torch.Tensor) for m in meta)
    r = QuantizedTensorStorage.from_buffers(buffers, meta)
    assert type(r) is type(s)
    checks = [lambda t: t.dequantize()]
    if name != "mxfp8" or usage != "col":
        checks.append(lambda t: t.dequantize_rowwise())
    if name != "mxfp8" or usage != "row":
        checks.append(lambda t: t.dequantize_columnwise(torch.float64))
    for f in checks:
        a, b = f(s), f(r)
        assert a.shape == x.shape and torch.equal(bits(a.float()), bits(b.float()))
    assert s.dequantize().dtype == torch.bfloat16
    if name == "mxfp8" and usage == "row":
        with pytest.raises(RuntimeError, match="columnwise data was not quantized"):
            s.dequantize_columnwise()


@pytest.mark.parametrize("name", list(_quantizers()))
def test_public_quantize_and_pipeline_share_one_implementation(name, monkeypatch):
    """quantizer(t) wraps quantize_storage with the quantizer's usages (same buffers), and a
    BasicLinear under the matching recipe quantizes through the same method."""
    q = _quantizers()[name]()
    cls = type(q)
    calls = []
    original = cls.quantize_storage

    def spy(self, tensor, **kwargs):
        calls.append(kwargs.get("op"))
        return original(self, tensor, **kwargs)

    monkeypatch.setattr(cls, "quantize_storage", spy)
    x = torch.randn(64, 64)
    t = q(x)
    assert calls == [cls.__name__] and isinstance(t, te.QuantizedTensor)
    s = _quantizers()[name]().quantize_storage(x, rowwise=True, columnwise=True)
    assert all((a is None and b is None) or torch.equal(a, b)
               for a, b in zip(t.buffers(), s.buffers()))
    calls.clear()
    make_recipe = {"current": recipe.Float8CurrentScaling,
                   "delayed": recipe.DelayedScaling, "mxfp8": recipe.MXFP8BlockScaling}[name]
    op = te.ops.BasicLinear(64, 64)
    with te.autocast(recipe=make_recipe()):
        op(torch.randn(32, 64, requires_grad=True)).sum().backward()
    assert calls == ["BasicLinear"] * 3  # input, weight, grad output


def test_emit_is_decided_by_the_quantizer():
    from transformer_engine_cpp.ops import _quantized
    from transformer_engine_cpp.quantization import Quantizer

    y = torch.randn(64, 32)
    for name, make in _quantizers().items():
        q = make()
        out = q.emit(y)
        assert _quantized.is_storage(out), name
        assert torch.equal(out.dequantize(), q.quantize_storage(y).dequantize()), name
        assert _quantized.emit(y, q).buffers()[0] is not None
    mx = te.MXFP8Quantizer(torch.float8_e4m3fn).emit(y)
    assert all(b is not None for b in mx.buffers())  # both copies for the consumer's GEMMs
    y_odd = torch.randn(40, 32)  # rows not a multiple of 32: MXFP8 hands over nothing
    assert te.MXFP8Quantizer(torch.float8_e4m3fn).emit(y_odd) is y_odd
    assert _quantized.emit(y, None) is y and Quantizer().emit(y) is y
    delayed = _quantizers()["delayed"]()
    delayed.emit(y * 5)
    assert delayed.amax.item() == (y * 5).abs().max().item()  # the amax record


def test_fake_quantize_is_the_rowwise_dequantization():
    x = torch.randn(32, 64, dtype=torch.float16)
    for q in (f() for f in _quantizers().values()):
        got = q.fake_quantize(x)
        assert got.dtype == torch.float16
        assert torch.equal(got, q.quantize_storage(x).dequantize_rowwise(torch.float16))


def test_caller_tensors_are_not_handed_over_storages():
    """Inside the pipeline only a bare storage counts as a handed-over operand: a Float8Tensor
    the caller passes is a tensor (quantized again like any input, as before)."""
    from transformer_engine_cpp.ops import _quantized
    from transformer_engine_cpp.quantization.tensor import as_storage

    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)
    t = q(torch.randn(8, 32))
    assert not _quantized.is_storage(t) and _quantized.as_high_precision(t) is t
    s = as_storage(t)
    assert _quantized.is_storage(s) and s._data is t._data and s._scale_inv is t._scale_inv
    assert torch.equal(_quantized.as_high_precision(s), t.dequantize())
    assert as_storage(s) is s
    m = te.MXFP8Quantizer(torch.float8_e4m3fn)(torch.randn(32, 64))
    ms = as_storage(m)
    assert _quantized.is_storage(ms) and ms._columnwise_data is m._columnwise_data
    assert torch.equal(ms.dequantize_columnwise(), m.dequantize_columnwise())
    assert torch.equal(s.to_tensor()._data, t._data)  # back to the public subclass


def test_transformer_engines_dtype_tags_and_quantizer_roles():
    """The names a ported script imports: te.DType (TransformerEngine's tags, its C API's
    values), accepted wherever an FP8 format is; te.QuantizerRole; te.get_default_recipe."""
    assert int(te.DType.kFloat8E4M3) == 7 and int(te.DType.kFloat8E5M2) == 8
    assert int(te.DType.kBFloat16) == 6 and te.DType.cast(4) is te.DType.kFloat32
    from transformer_engine_cpp.constants import TE_DType, TE_DType_To_Torch
    assert TE_DType[torch.float8_e5m2] is te.DType.kFloat8E5M2
    assert TE_DType_To_Torch[te.DType.kFloat8E4M3] is torch.float8_e4m3fn
    x = torch.randn(8, 32)
    by_tag = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2)
    by_dtype = te.Float8CurrentScalingQuantizer(torch.float8_e5m2)
    assert by_tag.dtype is torch.float8_e5m2
    assert torch.equal(by_tag(x)._data, by_dtype(x)._data)
    assert te.MXFP8Quantizer(te.DType.kFloat8E4M3).dtype is torch.float8_e4m3fn
    assert te.NVFP4Quantizer(te.DType.kFloat4E2M1).dtype is torch.float4_e2m1fn_x2
    with pytest.raises(ValueError, match="got <DType.kBFloat16: 6>"):
        te.Float8CurrentScalingQuantizer(te.DType.kBFloat16)
    role = te.QuantizerRole(module_type="linear", tensor_type="input")
    assert str(role) == "module_type=linear|tensor_type=input"
    assert str(te.QuantizerRole()) == "QuantizerRole()"
    with pytest.raises(dataclasses.FrozenInstanceError):
        role.name = "fc1"
    assert isinstance(te.get_default_recipe(), te.recipe.Float8CurrentScaling)


# ---- activation checkpointing ------------------------------------------------------------------


def _checkpointed_step(model, x, dy, make_recipe, context_fn=None):
    """Outputs and gradients of ``model(x)`` under ``te.autocast(recipe)``, through
    ``torch.utils.checkpoint`` (non-reentrant) with ``context_fn`` when one is given."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(1)  # NVFP4 draws (stochastic rounding); checkpoint replays the state
    with te.autocast(recipe=make_recipe()):
        if context_fn is None:
            y = model(x)
        else:
            y = checkpoint(model, x, use_reentrant=False, context_fn=context_fn)
    wants = [t for t in (x, *model.parameters()) if t.requires_grad]
    return [y.detach(), *torch.autograd.grad(y, wants, dy)]


@pytest.mark.parametrize("make_recipe", [recipe.Float8CurrentScaling, recipe.MXFP8BlockScaling,
                                         recipe.Float8BlockScaling, recipe.NVFP4BlockScaling],
                         ids=["current", "mxfp8", "block", "nvfp4"])
@pytest.mark.parametrize("frozen_linear", [False, True], ids=["trained", "frozen_linear"])
def test_checkpoint_recomputes_under_the_recipe_with_context_fn(make_recipe, frozen_linear):
    """torch.utils.checkpoint recomputes the forward in backward, outside te.autocast (it
    restores torch's autocast only), as in TransformerEngine, so the recompute would run
    unquantized (refused: the next test). A ``context_fn`` that re-enters the recipe for the
    recompute (docs/quantization.md) gives the un-checkpointed step bit for bit, also where the
    recompute saves few tensors (a frozen linear whose input needs no gradient)."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.BasicLinear(32, 32), te.ops.GELU(), te.ops.RMSNorm(32))
    model[0].weight.requires_grad_(not frozen_linear)
    x = torch.randn(32, 32)
    dy = torch.randn(32, 32)
    reference = _checkpointed_step(model, x, dy, make_recipe)

    def context_fn():
        return contextlib.nullcontext(), te.autocast(recipe=make_recipe())

    got = _checkpointed_step(model, x, dy, make_recipe, context_fn)
    for g, r in zip(got, reference, strict=True):
        assert torch.equal(g, r)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("frozen_linear", [False, True], ids=["trained", "frozen_linear"])
def test_checkpoint_recompute_outside_the_recipe_is_refused(reentrant, frozen_linear):
    """Without that context_fn, the recompute (during the backward) runs outside te.autocast:
    a te.ops forward during a backward pass under another recipe than the same model's previous
    forward raises, naming both, instead of handing back the unquantized recompute's gradients
    (which the reentrant checkpoint always did silently, the non-reentrant one where it saved as
    many tensors: the frozen linear)."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.BasicLinear(32, 32), te.ops.GELU(), te.ops.RMSNorm(32))
    model[0].weight.requires_grad_(not frozen_linear)
    x = torch.randn(32, 32, requires_grad=reentrant)  # reentrant: an input must need a grad
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = checkpoint(model, x, use_reentrant=reentrant)
    with pytest.raises(RuntimeError, match=r"during a backward pass under no recipe.*"
                                           r"Float8CurrentScaling.*context_fn"):
        y.backward(torch.randn(32, 32))
    # a recompute without recipe of a forward without one, and (non-reentrant: the reentrant
    # checkpoint takes no context_fn) one that context_fn runs under the forward's recipe
    y = checkpoint(model, x, use_reentrant=reentrant)
    y.backward(torch.randn(32, 32))
    if not reentrant:
        def context_fn():
            return contextlib.nullcontext(), te.autocast(recipe=recipe.Float8CurrentScaling())

        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            y = checkpoint(model, x, use_reentrant=False, context_fn=context_fn)
        y.backward(torch.randn(32, 32))
