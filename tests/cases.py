"""The one list of op cases that drives the conformance harness (tests/test_conformance.py).

Adding an op means adding one ``OpCase`` to ``OP_CASES``: how to build it, its float64
reference, its input width, the custom ops it exercises (each gets ``opcheck``), and the bad
inputs it must reject with a clear error.
"""

from __future__ import annotations

import functools

import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing import reference as ref

from activations import BIAS_ACT, GATED, SCALED, UNARY, op_params, reference
from opcase import OpCase, with_fit_blocks  # noqa: F401  (OpCase: the case type, re-exported)

te_ops = torch.ops.te_cpp


def _rand(*shape, dtype=torch.float32, scale=1.0):
    return torch.randn(shape, dtype=dtype) * scale


# ---- opcheck samples ----------------------------------------------------------------------------


def _shapes(features):
    """Sample shapes for opcheck: one row, a few rows with leading dims, zero rows."""
    return [(1, features), (2, 3, features), (0, features)]


def _non_contiguous(t):
    """A non-contiguous tensor with t's shape, dtype and values: every other element of a
    twice-as-wide buffer. A tensor of fewer than two elements is returned as it is."""
    if t.dim() == 0 or t.numel() < 2:
        return t
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    out = buf[..., ::2]
    out.copy_(t)
    return out


def _op_name(op) -> str:
    return op._qualified_op_name.split("::", 1)[1]


def _first_tensor(args) -> torch.Tensor:
    """A sample's first tensor argument: the data input, or the buffer an op writes in place."""
    return next(a for a in args if isinstance(a, torch.Tensor))


def _is_non_contiguous_sample(args) -> bool:
    return any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in args)


def _is_zero_size_sample(args) -> bool:
    first = _first_tensor(args)
    return first.dim() > 0 and first.numel() == 0


#: Tensor arguments a custom op requires to be contiguous, by op name and argument index
#: (with the reason); everything else accepts any strides. Each entry must reject a
#: non-contiguous argument with a clear error (test_conformance.py::
#: test_contiguous_arguments_reject_non_contiguous_input). None today: every kernel reads its
#: inputs through .contiguous(), and the in-place ops update a non-contiguous buffer through a
#: contiguous copy.
CONTIGUOUS_ARGUMENTS: dict[str, dict[int, str]] = {}


def _with_non_contiguous(samples):
    """``samples`` plus, for each op among them that has no non-contiguous sample yet, a copy
    of its largest sample with every tensor argument made non-contiguous (same values). The
    arguments an op requires contiguous (CONTIGUOUS_ARGUMENTS) stay contiguous."""
    out = list(samples)
    by_op: dict = {}
    for op, args in samples:
        by_op.setdefault(op, []).append(args)
    for op, all_args in by_op.items():
        if any(_is_non_contiguous_sample(a) for a in all_args):
            continue
        largest = max(all_args, key=lambda a: _first_tensor(a).numel())
        keep = CONTIGUOUS_ARGUMENTS.get(_op_name(op), {})
        out.append((op, tuple(_non_contiguous(a) if isinstance(a, torch.Tensor) and i not in keep
                              else a for i, a in enumerate(largest))))
    return out


@functools.cache  # one samples function per configuration: opchecked once
def _samples_unary(stem):
    def samples(dtype):
        out = []
        for shape in _shapes(16):
            x = _rand(*shape, dtype=dtype)
            dy = _rand(*shape, dtype=dtype)
            out += [(getattr(te_ops, f"{stem}_fwd"), (x,)),
                    (getattr(te_ops, f"{stem}_bwd"), (dy, x)),
                    (getattr(te_ops, f"dbias_d{stem}"), (dy, x, dtype))]
        # a non-contiguous (transposed) input
        xt = _rand(16, 5, dtype=dtype).t()
        out.append((getattr(te_ops, f"{stem}_fwd"), (xt,)))
        return _with_non_contiguous(out)
    return samples


@functools.cache  # one samples function per configuration: opchecked once
def _samples_gated(stem, *args, interleave=0, features=16):
    def samples(dtype):
        out = []
        for shape in _shapes(features):
            x = _rand(*shape, dtype=dtype)
            dy = _rand(*shape[:-1], features // 2, dtype=dtype)
            out += [(getattr(te_ops, f"{stem}_fwd"), (x, *args, interleave)),
                    (getattr(te_ops, f"{stem}_bwd"), (dy, x, *args, interleave))]
        return _with_non_contiguous(out)
    return samples


def _samples_bias(dtype):
    out = []
    for shape in _shapes(11):
        x, b, dy = _rand(*shape, dtype=dtype), _rand(11, dtype=dtype), _rand(*shape, dtype=dtype)
        out += [(te_ops.bias_fwd, (x, b)), (te_ops.bias_bwd, (dy, dtype))]
    # mixed dtypes: fp32 bias on a low-precision input promotes
    out.append((te_ops.bias_fwd, (_rand(3, 11, dtype=dtype), _rand(11, dtype=torch.float32))))
    out.append((te_ops.bias_bwd, (_rand(130, 11, dtype=dtype), torch.float32)))
    return _with_non_contiguous(out)


def _samples_scale(dtype):
    out = []
    for shape in [(2, 3, 9), (0, 9)]:
        x = _rand(*shape, dtype=dtype)
        out += [(te_ops.constant_scale_fwd, (x, 0.5)), (te_ops.constant_scale_bwd, (x, -2.0))]
    return _with_non_contiguous(out)


def _samples_add_extra_input(dtype):
    out = []
    for shape in [(2, 3, 9), (0, 9)]:
        x, e = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype)
        out += [(te_ops.add_extra_input_fwd, (x, e)),
                (te_ops.add_extra_input_fwd_inplace, (e.clone(), x)),
                (te_ops.add_extra_input_fwd, (x, e.float()))]
    return _with_non_contiguous(out)


def _samples_make_extra_output(dtype):
    out = []
    for shape in [(2, 3, 9), (0, 9)]:
        dy, de = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype)
        out += [(te_ops.make_extra_output_bwd, (dy, de)),
                (te_ops.make_extra_output_bwd_inplace, (de.clone(), dy))]
    return _with_non_contiguous(out)


def _samples_l2normalization(dtype):
    out = []
    for shape in _shapes(16) + [(13,)]:
        x, dy = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype)
        y, rnorm = te_ops.l2normalization_fwd(x, 1e-6)
        out += [(te_ops.l2normalization_fwd, (x, 1e-6)),
                (te_ops.l2normalization_bwd, (dy, x, rnorm))]
    xt = _rand(16, 5, dtype=dtype).t()
    out.append((te_ops.l2normalization_fwd, (xt, 0.5)))
    rnorm_t = te_ops.l2normalization_fwd(xt, 0.5)[1]
    out.append((te_ops.l2normalization_bwd, (xt.clone(), xt, rnorm_t)))
    return _with_non_contiguous(out)


@functools.cache  # one samples function per configuration: opchecked once
def _samples_scaled(stem, *args, gated=True, interleave=0, features=16):
    fwd, bwd = getattr(te_ops, f"{stem}_fwd"), getattr(te_ops, f"{stem}_bwd")
    extra = (interleave,) if gated else ()

    def samples(dtype):
        out = []
        for shape in _shapes(features) + [(features,)]:
            x, s = _rand(*shape, dtype=dtype), _rand(*shape[:-1], dtype=dtype)
            dy = _rand(*shape[:-1], features // 2 if gated else features, dtype=dtype)
            out += [(fwd, (x, s, *args, *extra)),
                    (bwd, (dy, x, s, True, *args, *extra)),
                    (bwd, (dy, x, s, False, *args, *extra))]
        # non-contiguous input and scales; fp32 scales with a low-precision input
        xt = _rand(features, 6, dtype=dtype).t()
        st = _rand(12, dtype=torch.float32)[::2]
        dyt = _rand(6, features // 2 if gated else features, dtype=dtype)
        out += [(fwd, (xt, st, *args, *extra)), (bwd, (dyt, xt, st, True, *args, *extra))]
        return _with_non_contiguous(out)
    return samples


def _samples_dropout(dtype):
    # dropout_fwd is a deterministic function of (x, seed, p): the mask comes from a
    # counter-based draw keyed by the seed tensor, not from a generator's state. So every
    # opcheck utility is meaningful for it, test_aot_dispatch_dynamic included (it compares
    # real outputs of repeated runs, which an op drawing from a global generator would fail).
    out = []
    seed = torch.tensor(20240607, dtype=torch.int64)
    for shape, p in [((1, 16), 0.3), ((2, 3, 16), 0.5), ((13,), 0.0), ((0, 16), 0.3)]:
        x, dy = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype)
        _, mask = te_ops.dropout_fwd(x, seed, p)
        out += [(te_ops.dropout_fwd, (x, seed, p)), (te_ops.dropout_bwd, (dy, mask, p))]
    xt = _rand(16, 5, dtype=dtype).t()
    out.append((te_ops.dropout_fwd, (xt, torch.tensor([-7], dtype=torch.int64), 0.25)))
    out.append((te_ops.dropout_bwd, (xt, te_ops.dropout_fwd(xt, seed, 0.25)[1], 0.25)))
    return _with_non_contiguous(out)


# ---- bad inputs ---------------------------------------------------------------------------------


def _bad_dtype(op_factory, features, name):
    return ("integer input", lambda: op_factory()(torch.ones(3, features, dtype=torch.int32)),
            RuntimeError, rf"te_cpp\.{name}: input must be float32")


def _bad_device(op_factory, features, name):
    """An input on another device than the op's parameters."""
    return ("meta input, cpu parameters",
            lambda: op_factory()(torch.ones(3, features, device="meta")),
            RuntimeError, rf"te_cpp\.{name}: .*same device, got meta and cpu")


def _unary_case(cls):
    stem, ref_fn = cls.op_stem, reference(cls())
    return OpCase(
        id=cls.__name__,
        make=lambda dtype: [cls()],
        reference=lambda p, x: ref_fn(x),
        features=37,
        opcheck_samples=_samples_unary(stem),
        bad_inputs=(_bad_dtype(cls, 8, f"{stem}_fwd"),),
    )


def _gated_case(cls, *, ctor=None, interleave=None, features=38, input_scale=1.0):
    ctor = dict(ctor or {})
    if interleave is not None:
        ctor["glu_interleave_size"] = interleave
    stem, op = cls.op_stem, cls(**ctor)
    args, ref_fn = op_params(op), reference(op)
    return OpCase(
        id=cls.__name__ + (f"(interleave={interleave})" if interleave else ""),
        make=lambda dtype: [cls(**ctor)],
        reference=lambda p, x: ref_fn(x),
        features=features,
        opcheck_samples=_samples_gated(stem, *args, interleave=interleave or 0,
                                       features=features if interleave else 16),
        input_scale=input_scale,
        bad_inputs=(
            _bad_dtype(lambda: cls(**ctor), features, f"{stem}_fwd"),
            ("odd width", lambda: cls(**ctor)(torch.ones(3, features + 1)),
             RuntimeError, rf"te_cpp\.{stem}_fwd: the last dimension of the input \(shape \[3, "
                           rf"{features + 1}\]\) must be divisible by"),
        ),
    )


def _bias_case():
    return OpCase(
        id="Bias",
        make=lambda dtype: [te.ops.Bias(37, dtype=dtype)],
        reference=lambda p, x: ref.bias(x, p["0.bias"]),
        features=37,
        opcheck_samples=_samples_bias,
        bad_inputs=(
            ("size mismatch", lambda: te.ops.Bias(8)(torch.ones(3, 9)), RuntimeError,
             r"te_cpp\.bias_fwd: input's last dimension \(shape \[3, 9\]\) must equal the bias "
             r"size 8"),
            _bad_dtype(lambda: te.ops.Bias(8), 8, "bias_fwd"),
            _bad_device(lambda: te.ops.Bias(8), 8, "bias_fwd"),
        ),
    )


def _l2normalization_case(eps=None):
    ctor = {} if eps is None else {"eps": eps}
    ref_eps = 1e-6 if eps is None else eps
    return OpCase(
        id="L2Normalization" + ("" if eps is None else f"(eps={eps})"),
        make=lambda dtype: [te.ops.L2Normalization(**ctor)],
        reference=lambda p, x: ref.l2normalization(x, ref_eps),
        features=37,
        opcheck_samples=_samples_l2normalization,
        bad_inputs=(
            _bad_dtype(te.ops.L2Normalization, 8, "l2normalization_fwd"),
            ("0-d input", lambda: te.ops.L2Normalization()(torch.tensor(2.0)), RuntimeError,
             r"te_cpp\.l2normalization_fwd: input must have at least 1 dimension\(s\), got "
             r"shape \[\]"),
            ("negative eps", lambda: te_ops.l2normalization_fwd(torch.ones(2, 3), -1.0),
             ValueError, r"te_cpp\.l2normalization_fwd: eps must be finite and >= 0, got -1"),
            ("rsqrt_norm dtype",
             lambda: te_ops.l2normalization_bwd(torch.ones(2, 3, dtype=torch.bfloat16),
                                                torch.ones(2, 3, dtype=torch.bfloat16),
                                                torch.ones(2, dtype=torch.bfloat16)),
             RuntimeError, r"te_cpp\.l2normalization_bwd: rsqrt_norm must be Float for a "
                           r"BFloat16 input, got BFloat16"),
            ("rsqrt_norm shape",
             lambda: te_ops.l2normalization_bwd(torch.ones(2, 3), torch.ones(2, 3),
                                                torch.ones(3)),
             RuntimeError, r"te_cpp\.l2normalization_bwd: rsqrt_norm must have the input's "
                           r"leading shape, got \[3\] for input shape \[2, 3\]"),
            ("grad_output shape",
             lambda: te_ops.l2normalization_bwd(torch.ones(2, 4), torch.ones(2, 3),
                                                torch.ones(2)),
             RuntimeError, r"te_cpp\.l2normalization_bwd: grad_output and input must have the "
                           r"same shape, got \[2, 4\] and \[2, 3\]"),
        ),
    )


def _rows(lead, features):
    """The per-row scales' shape."""
    return tuple(lead)


def _with_ones_scales(make_op):
    """An op factory for _bad_dtype: the op, called on x, gets all-ones scales of the right
    shape."""
    def factory():
        op = make_op()
        return lambda x: op(x, torch.ones(x.shape[:-1]))
    return factory


def _scaled_case(cls, *, ctor=None, interleave=None, features=None, input_scale=1.0,
                 scales_require_grad=True):
    gated, stem = cls.gated, cls.op_stem
    features = features or (38 if gated else 37)
    ctor = dict(ctor or {})
    make_op = lambda: cls(interleave, **ctor) if gated else cls(**ctor)  # noqa: E731
    args, ref_fn = op_params(make_op()), reference(make_op())
    bad = [
        _bad_dtype(_with_ones_scales(make_op), features, f"{stem}_fwd"),
        ("scales shape", lambda: make_op()(torch.ones(3, features), torch.ones(features)),
         RuntimeError, rf"te_cpp\.{stem}_fwd: scales shape \[{features}\] must equal the "
                       rf"input's leading dims \(input shape \[3, {features}\]\)"),
        ("integer scales",
         lambda: make_op()(torch.ones(3, features), torch.ones(3, dtype=torch.int64)),
         RuntimeError, rf"te_cpp\.{stem}_fwd: scales must be float32"),
        ("meta scales", lambda: make_op()(torch.ones(3, features), torch.ones(3, device="meta")),
         RuntimeError, rf"te_cpp\.{stem}_fwd: scales and input must be on the same "
                       rf"device, got meta and cpu"),
    ]
    if gated:
        bad.append(("odd width", lambda: make_op()(torch.ones(3, features + 1), torch.ones(3)),
                    RuntimeError, rf"te_cpp\.{stem}_fwd: the last dimension of the input "
                                  rf"\(shape \[3, {features + 1}\]\) must be divisible by"))
    else:
        bad.append(("0-d input", lambda: make_op()(torch.tensor(1.0), torch.tensor(1.0)),
                    RuntimeError, rf"te_cpp\.{stem}_fwd: input must have at least 1 "
                                  rf"dimension\(s\), got shape \[\]"))
    suffix = (f"(interleave={interleave})" if interleave else "") + (
        "" if scales_require_grad else "(scales without grad)")
    return OpCase(
        id=cls.__name__ + suffix,
        make=lambda dtype: [make_op()],
        reference=lambda p, x, s: ref_fn(x, s),
        features=features,
        num_extra_inputs=1,
        extra_shape=_rows,
        extra_requires_grad=scales_require_grad,
        opcheck_samples=_samples_scaled(stem, *args, gated=gated, interleave=interleave or 0,
                                        features=features if interleave else 16),
        input_scale=input_scale,
        bad_inputs=tuple(bad),
    )


def _dropout_case(p, *, training):
    """Dropout's deterministic configurations (evaluation mode, or p == 0 in training) run
    through the harness; its random training output has its own tests (tests/test_dropout.py).
    The case also carries the opcheck samples and bad inputs of dropout_fwd / dropout_bwd."""
    seed = torch.tensor(1, dtype=torch.int64)
    return OpCase(
        id=f"Dropout(p={p}, {'train' if training else 'eval'})",
        make=lambda dtype: [te.ops.Dropout(p).train(training)],
        reference=lambda params, x: x,
        features=37,
        opcheck_samples=_samples_dropout,
        bad_inputs=(
            ("p = 1 (op)", lambda: te_ops.dropout_fwd(torch.ones(2, 3), seed, 1.0), ValueError,
             r"te_cpp\.dropout_fwd: dropout probability p must be in \[0, 1\), got 1"),
            ("negative p (bwd)",
             lambda: te_ops.dropout_bwd(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.uint8),
                                        -0.5),
             ValueError, r"te_cpp\.dropout_bwd: dropout probability p must be in \[0, 1\), "
                         r"got -0\.5"),
            ("integer input", lambda: te.ops.Dropout(0.5)(torch.ones(3, 4, dtype=torch.int32)),
             RuntimeError, r"te_cpp\.dropout_fwd: input must be float32"),
            ("float seed", lambda: te_ops.dropout_fwd(torch.ones(2, 3), torch.tensor(1.0), 0.5),
             RuntimeError, r"te_cpp\.dropout_fwd: seed must be an int64 tensor, got Float"),
            ("two seeds",
             lambda: te_ops.dropout_fwd(torch.ones(2, 3), torch.ones(2, dtype=torch.int64), 0.5),
             RuntimeError, r"te_cpp\.dropout_fwd: seed must have exactly one element, got "
                           r"shape \[2\]"),
            ("seed on another device",
             lambda: te_ops.dropout_fwd(torch.ones(2, 3, device="meta"), seed, 0.5),
             RuntimeError, r"te_cpp\.dropout_fwd: input and seed must be on the same device, "
                           r"got meta and cpu"),
            ("bool mask",
             lambda: te_ops.dropout_bwd(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                        0.5),
             RuntimeError, r"te_cpp\.dropout_bwd: mask must be uint8 \(dropout_fwd's mask\), "
                           r"got Bool"),
            ("mask shape",
             lambda: te_ops.dropout_bwd(torch.ones(2, 3), torch.ones(3, 2, dtype=torch.uint8),
                                        0.5),
             RuntimeError, r"te_cpp\.dropout_bwd: grad_output and mask must have the same "
                           r"shape, got \[2, 3\] and \[3, 2\]"),
        ),
    )


def _samples_bias_act(stem):
    """bias_act_fwd, and dbias_d<act> given the bias (z = x + bias recomputed in the kernel),
    including mixed dtypes (a float32 bias on a low-precision input promotes, as bias_fwd)."""
    unary = _samples_unary(stem)

    def samples(dtype):
        out = unary(dtype)
        for shape in _shapes(16):
            x, dy, b = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype), _rand(16, dtype=dtype)
            out += [(te_ops.bias_act_fwd, (x, b, stem)),
                    (getattr(te_ops, f"dbias_d{stem}"), (dy, x, dtype, b))]
        x, b32 = _rand(3, 16, dtype=dtype), _rand(16, dtype=torch.float32)
        out += [(te_ops.bias_act_fwd, (x, b32, stem)),
                (getattr(te_ops, f"dbias_d{stem}"), (_rand(3, 16, dtype=dtype), x, torch.float32,
                                                     b32)),
                (te_ops.bias_act_fwd, (_rand(16, 5, dtype=dtype).t(), _rand(16, dtype=dtype), stem))]
        return _with_non_contiguous(out)
    return samples


def _bias_act_case(act_cls):
    """Bias followed by a unary activation: one bias_act_fwd pass forward, the fused
    dbias_d<act> op (recomputing the bias output from the saved input and bias) backward."""
    from transformer_engine_cpp.ops.fused import BackwardActivationBias, ForwardBiasActivation

    stem, ref_fn = act_cls.op_stem, reference(act_cls())
    return OpCase(
        id=f"Bias+{act_cls.__name__}",
        make=lambda dtype: [te.ops.Bias(37, dtype=dtype), act_cls()],
        # the bias output is stored in the working dtype before the activation reads it
        reference=lambda p, x: ref_fn(p.round(ref.bias(x, p["0.bias"]))),
        features=37,
        opcheck_samples=_samples_bias_act(stem),
        fused_forward=(ForwardBiasActivation,),
        fused_backward=(BackwardActivationBias,) if act_cls.fuses_dbias_dact else (),
        bad_inputs=(
            ("size mismatch", lambda: te.ops.Sequential(te.ops.Bias(8), act_cls())(
                torch.ones(3, 9)), RuntimeError,
             r"te_cpp\.bias_act_fwd: input's last dimension \(shape \[3, 9\]\) must equal the "
             r"bias size 8"),
            ("integer input", lambda: te.ops.Sequential(te.ops.Bias(8), act_cls())(
                torch.ones(3, 8, dtype=torch.int32)), RuntimeError,
             r"te_cpp\.bias_act_fwd: input must be float32"),
            ("unknown activation", lambda: te_ops.bias_act_fwd(torch.ones(3, 8), torch.ones(8),
                                                                "tanh"), ValueError,
             # the names are checked against the activation table in test_activation_table.py
             r"te_cpp\.bias_act_fwd: activation must be one of [a-z_, ]+, got 'tanh'"),
            ("dbias bias size mismatch", lambda: getattr(te_ops, f"dbias_d{stem}")(
                torch.ones(3, 8), torch.ones(3, 8), torch.float32, torch.ones(9)), RuntimeError,
             rf"te_cpp\.dbias_d{stem}: input's last dimension \(shape \[3, 8\]\) must equal the "
             r"bias size 9"),
        ),
    )


@functools.cache  # one samples function per configuration: opchecked once
def _samples_norm(kind, tail=(13,)):
    def samples(dtype):
        out = []
        for lead in [(1,), (2, 3), (0,)]:
            x = _rand(*lead, *tail, dtype=dtype)
            dy = _rand(*lead, *tail, dtype=dtype)
            w, b = _rand(*tail, dtype=dtype), _rand(*tail, dtype=dtype)
            for zcg in (False, True):
                if kind == "layernorm":
                    y, mean, rstd = te_ops.layernorm_fwd(x, w, b, 1e-5, zcg)
                    out += [(te_ops.layernorm_fwd, (x, w, b, 1e-5, zcg)),
                            (te_ops.layernorm_bwd, (dy, x, mean, rstd, w, zcg))]
                else:
                    y, rstd = te_ops.rmsnorm_fwd(x, w, 1e-5, zcg)
                    out += [(te_ops.rmsnorm_fwd, (x, w, 1e-5, zcg)),
                            (te_ops.rmsnorm_bwd, (dy, x, rstd, w, zcg)),
                            (te_ops.rmsnorm_bwd_add, (dy, x, rstd, w, zcg, _rand(*lead, *tail,
                                                                                  dtype=dtype)))]
        return _with_non_contiguous(out)
    return samples


def _norm_case(cls, shape, *, zcg=False, eps=1e-5):
    name = cls.__name__
    stem = "layernorm" if cls is te.ops.LayerNorm else "rmsnorm"
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)

    def reference(p, x):
        if stem == "layernorm":
            return ref.layer_norm(x, p["0.weight"], p["0.bias"], eps, zcg)
        return ref.rms_norm(x, p["0.weight"], eps, zcg)

    return OpCase(
        id=f"{name}{list(shape)}" + ("(zero_centered_gamma)" if zcg else ""),
        make=lambda dtype: [cls(shape, eps=eps, dtype=dtype, zero_centered_gamma=zcg)],
        reference=reference,
        features=shape[-1],
        input_tail=shape,
        opcheck_samples=_samples_norm(stem, shape),
        bad_inputs=(
            ("normalized shape mismatch", lambda: cls(shape)(torch.ones(3, shape[-1] + 1)),
             RuntimeError, rf"te_cpp\.{stem}_fwd: the trailing dims of the input \(shape "
                           rf"\[3, {shape[-1] + 1}\]\) must equal the normalized shape"),
            ("integer input", lambda: cls(shape)(torch.ones(3, *shape, dtype=torch.int32)),
             TypeError, rf"{name}: input must be floating point, got torch.int32"),
            _bad_device(lambda: cls(shape[-1]), shape[-1], f"{stem}_fwd"),
        ),
    )


def _add_rmsnorm_case():
    from transformer_engine_cpp.ops.fused import BackwardAddRMSNorm

    return OpCase(
        id="MakeExtraOutput+RMSNorm",
        make=lambda dtype: [te.ops.MakeExtraOutput(), te.ops.RMSNorm(37, dtype=dtype)],
        reference=lambda p, x: (ref.rms_norm(x, p["1.weight"]), x),
        features=37,
        opcheck_samples=_samples_norm("rmsnorm", (37,)),
        fused_backward=(BackwardAddRMSNorm,),
    )


def _samples_linear(dtype):
    out = []
    for lead in [(1,), (2, 3), (0,)]:
        x = _rand(*lead, 13, dtype=dtype)
        w, b = _rand(7, 13, dtype=dtype), _rand(7, dtype=dtype)
        dy, extra = _rand(*lead, 7, dtype=dtype), _rand(*lead, 7, dtype=dtype)
        dextra = _rand(*lead, 13, dtype=dtype)
        out += [
            (te_ops.linear_fwd, (x, w)),
            (te_ops.linear_fwd, (x, w, b)),
            (te_ops.linear_bias_act_fwd, (x, w, b, "gelu")),
            (te_ops.linear_bias_act_fwd, (x, w, None, "srelu")),
            (te_ops.linear_fwd_add, (x, w, b, extra, 1.0)),
            (te_ops.linear_fwd_add, (x, w, None, extra.double(), -0.5)),
            (te_ops.linear_fwd_add_inplace, (extra.clone(), x, w, b, 2.0)),
            (te_ops.linear_dgrad, (dy, w, 1.0)),
            (te_ops.linear_dgrad, (dy, w, 0.25)),
            (te_ops.linear_dgrad_add, (dy, w, dextra, 1.0)),
            (te_ops.linear_wgrad, (dy, x, 1.0)),
            (te_ops.linear_wgrad, (dy, x, 3.0)),
            (te_ops.linear_bwd, (dy, x, w, 1.0, None)),
            (te_ops.linear_bwd, (dy, x, w, 0.5, dtype)),
            (te_ops.linear_bwd, (dy, x, w, 1.0, torch.float32)),
        ]
    # a transposed (non-contiguous) weight and input
    out.append((te_ops.linear_fwd, (_rand(13, 4, dtype=dtype).t(), _rand(13, 7, dtype=dtype).t())))
    return _with_non_contiguous(out)


def _linear_bad_inputs(make, num_extra_inputs, in_f, out_f):
    extras = [torch.ones(3, out_f)] * num_extra_inputs
    return (
        ("in_features mismatch", lambda: make()(torch.ones(3, in_f - 1), *extras), RuntimeError,
         rf"te_cpp\.linear_\w+: input's last dimension \(shape \[3, {in_f - 1}\]\) must equal "
         rf"in_features of the weight \(shape \[{out_f}, {in_f}\]\)"),
        ("integer input", lambda: make()(torch.ones(3, in_f, dtype=torch.int64), *extras),
         TypeError, r"BasicLinear: input must be floating point, got torch.int64"),
        ("meta input, cpu parameters",
         lambda: make()(torch.ones(3, in_f, device="meta"), *[e.to("meta") for e in extras]),
         RuntimeError, r"te_cpp\.linear_\w+: .*same device, got meta and cpu"),
    )


def _linear_case(case_id, make, reference, in_f, out_f, *, num_extra_inputs=0,
                 fused_forward=(), fused_backward=(), bad=True):
    return OpCase(id=case_id, make=make, reference=reference, features=in_f,
                  num_extra_inputs=num_extra_inputs, extra_input_tail=(out_f,),
                  opcheck_samples=_samples_linear,
                  fused_forward=fused_forward, fused_backward=fused_backward,
                  bad_inputs=_linear_bad_inputs(lambda: te.ops.Sequential(*make(torch.float32)),
                                                num_extra_inputs, in_f, out_f)
                  if bad else ())


def _linear_cases():
    """The linear cases at 13 -> 7 features, and at (2 block) -> block under a block recipe."""
    return with_fit_blocks(_sized_linear_cases, (13, 7), lambda block: (2 * block, block))


def _sized_linear_cases(in_f, out_f):
    from transformer_engine_cpp.ops import fused as F

    lin = lambda dtype, bias=True: te.ops.Linear(in_f, out_f, bias=bias, dtype=dtype)  # noqa: E731
    basic = lambda dtype: te.ops.BasicLinear(in_f, out_f, dtype=dtype)  # noqa: E731
    case = functools.partial(_linear_case, in_f=in_f, out_f=out_f)
    W, B = "0.basic_ops.0.weight", "0.basic_ops.1.bias"
    return [
        case("BasicLinear", lambda dtype: [basic(dtype)],
                     lambda p, x: ref.linear(x, p["0.weight"])),
        case("Linear", lambda dtype: [lin(dtype)],
                     lambda p, x: ref.linear(x, p[W], p[B]),
                     fused_forward=(F.ForwardLinearBiasActivation,),
                     fused_backward=(F.BackwardLinearBias,)),
        case("Linear(bias=False)", lambda dtype: [lin(dtype, False)],
                     lambda p, x: ref.linear(x, p[W])),
        # bias and activation in the GEMM's epilogue pass; dbias+dact fused in backward
        case("Linear+GELU", lambda dtype: [lin(dtype), te.ops.GELU()],
                     # dgelu's output is stored (rounded) before the dgrad/wgrad GEMMs; dbias
                     # is reduced from the unrounded values in the same kernel
                     lambda p, x: ref.gelu(p.round(p.round_grad(ref.linear(x, p[W])) + p[B])),
                     fused_forward=(F.ForwardLinearBiasActivation,),
                     fused_backward=(F.BackwardActivationBias,)),
        case("Linear+ReLU", lambda dtype: [lin(dtype), te.ops.ReLU()],
                     lambda p, x: ref.relu(p.round(p.round_grad(ref.linear(x, p[W])) + p[B])),
                     fused_forward=(F.ForwardLinearBiasActivation,),
                     fused_backward=(F.BackwardActivationBias,)),
        case("BasicLinear+SiLU", lambda dtype: [basic(dtype), te.ops.SiLU()],
                     lambda p, x: ref.silu(p.round(p.round_grad(ref.linear(x, p["0.weight"])))),
                     fused_forward=(F.ForwardLinearBiasActivation,)),
        # the GEMM accumulates into the residual
        case("Linear+AddExtraInput", lambda dtype: [lin(dtype), te.ops.AddExtraInput()],
                     lambda p, x, e: p.round(ref.linear(x, p[W]) + e) + p[B],
                     num_extra_inputs=1, fused_forward=(F.ForwardLinearBiasAdd,),
                     fused_backward=(F.BackwardLinearBias,)),
        case("Linear+AddExtraInput(in_place)",
                     lambda dtype: [lin(dtype), te.ops.AddExtraInput(in_place=True)],
                     lambda p, x, e: p.round(ref.linear(x, p[W]) + e) + p[B],
                     num_extra_inputs=1, fused_forward=(F.ForwardLinearBiasAdd,),
                     fused_backward=(F.BackwardLinearBias,)),
        case("BasicLinear+ConstantScale+AddExtraInput",
                     lambda dtype: [basic(dtype), te.ops.ConstantScale(-0.75),
                                    te.ops.AddExtraInput()],
                     lambda p, x, e: e - 0.75 * ref.linear(x, p["0.weight"]),
                     num_extra_inputs=1, fused_forward=(F.ForwardLinearScaleAdd,),
                     fused_backward=(F.BackwardLinearScale,)),
        case("BasicLinear+ConstantScale",
                     lambda dtype: [basic(dtype), te.ops.ConstantScale(2.5)],
                     lambda p, x: 2.5 * p.round(ref.linear(x, p["0.weight"])),
                     fused_backward=(F.BackwardLinearScale,)),
        # dgrad accumulated onto the residual branch's gradient
        case("MakeExtraOutput(in_place)+Linear",
                     lambda dtype: [te.ops.MakeExtraOutput(in_place=True), lin(dtype)],
                     lambda p, x: (ref.linear(x, p["1.basic_ops.0.weight"],
                                              p["1.basic_ops.1.bias"]), x),
                     fused_forward=(F.ForwardLinearBiasActivation,),
                     fused_backward=(F.BackwardLinearAdd,), bad=False),
        case("MakeExtraOutput+BasicLinear",
                     lambda dtype: [te.ops.MakeExtraOutput(), basic(dtype)],
                     lambda p, x: (ref.linear(x, p["1.weight"]), x),
                     fused_backward=(F.BackwardLinearAdd,), bad=False),
    ]


_CLAMPED = dict(limit=1.5, alpha=1.702, glu_linear_offset=0.5)
_SITU = dict(beta1=2.0, beta2=3.0)

#: The conformance configurations of an activation class: keyword arguments of its case
#: function (constructor arguments, interleave size, input width and scale, scales without
#: grad). A class not listed runs once with its defaults. The inputs are scaled up to reach the
#: clamps (limit 1.5) and SiTUGLU's tanh saturation (beta 2 and 3).
ACTIVATION_CONFIGS = {
    te.ops.SwiGLU: [{}, dict(interleave=3, features=42)],
    te.ops.ClampedSwiGLU: [dict(ctor=_CLAMPED, input_scale=2.0),
                           dict(ctor=_CLAMPED, interleave=16, features=64, input_scale=2.0)],
    te.ops.SiTUGLU: [dict(ctor=_SITU, input_scale=3.0),
                     dict(ctor=_SITU, interleave=5, features=40, input_scale=3.0)],
    te.ops.ScaledSwiGLU: [{}, dict(interleave=3, features=42), dict(scales_require_grad=False)],
    te.ops.ScaledClampedQGeGLU: [dict(ctor=_CLAMPED, input_scale=2.0),
                                 dict(ctor=_CLAMPED, interleave=16, features=64,
                                      input_scale=2.0)],
    te.ops.ScaledSiTUGLU: [dict(ctor=_SITU, input_scale=3.0),
                           dict(ctor=_SITU, interleave=5, features=40, input_scale=3.0)],
    te.ops.ScaledSReLU: [{}, dict(scales_require_grad=False)],
}

OP_CASES: list[OpCase] = [
    OpCase(id="Identity", make=lambda dtype: [te.ops.Identity()], reference=lambda p, x: x,
           features=37),
    OpCase(id="Reshape", make=lambda dtype: [te.ops.Reshape((-1, 2, 19))],
           reference=lambda p, x: x.reshape(-1, 2, 19), features=38,
           bad_inputs=(("bad shape", lambda: te.ops.Reshape((-1, 5))(torch.ones(3, 7)),
                        RuntimeError, r"shape '\[-1, 5\]' is invalid"),)),
    _bias_case(),
    OpCase(id="ConstantScale", make=lambda dtype: [te.ops.ConstantScale(-1.75)],
           reference=lambda p, x: ref.constant_scale(x, -1.75), features=37,
           opcheck_samples=_samples_scale,
           bad_inputs=(_bad_dtype(lambda: te.ops.ConstantScale(2.0), 8, "constant_scale_fwd"),)),
    OpCase(id="MakeExtraOutput", make=lambda dtype: [te.ops.MakeExtraOutput()],
           reference=lambda p, x: (x, x), features=37, opcheck_samples=_samples_make_extra_output),
    OpCase(id="MakeExtraOutput(in_place)", make=lambda dtype: [te.ops.MakeExtraOutput(in_place=True)],
           reference=lambda p, x: (x, x), features=37, opcheck_samples=_samples_make_extra_output),
    OpCase(id="AddExtraInput", make=lambda dtype: [te.ops.AddExtraInput()],
           reference=lambda p, x, e: x + e, features=37, num_extra_inputs=1,
           opcheck_samples=_samples_add_extra_input,
           bad_inputs=(
               ("extra shape mismatch",
                lambda: te.ops.AddExtraInput()(torch.ones(3, 8), torch.ones(3, 9)),
                RuntimeError, r"te_cpp\.add_extra_input_fwd: input and extra_input must have "
                              r"the same shape, got \[3, 8\] and \[3, 9\]"),
               ("integer extra",
                lambda: te.ops.AddExtraInput()(torch.ones(3, 8), torch.ones(3, 8, dtype=torch.int64)),
                RuntimeError, r"te_cpp\.add_extra_input_fwd: extra_input must be float32"),
           )),
    OpCase(id="AddExtraInput(in_place)", make=lambda dtype: [te.ops.AddExtraInput(in_place=True)],
           reference=lambda p, x, e: x + e, features=37, num_extra_inputs=1,
           opcheck_samples=_samples_add_extra_input),
    *[_unary_case(cls) for cls in UNARY],
    *[_gated_case(cls, **cfg) for cls in GATED for cfg in ACTIVATION_CONFIGS.get(cls, [{}])],
    *[_scaled_case(cls, **cfg) for cls in SCALED for cfg in ACTIVATION_CONFIGS.get(cls, [{}])],
    _l2normalization_case(),
    _l2normalization_case(eps=0.5),
    _dropout_case(0.3, training=False),
    _dropout_case(0.0, training=True),
    *[_bias_act_case(cls) for cls in BIAS_ACT],
    _norm_case(te.ops.LayerNorm, 37),
    _norm_case(te.ops.LayerNorm, 37, zcg=True, eps=1e-3),
    _norm_case(te.ops.LayerNorm, (3, 13)),
    _norm_case(te.ops.RMSNorm, 37),
    _norm_case(te.ops.RMSNorm, 37, zcg=True, eps=1e-3),
    _norm_case(te.ops.RMSNorm, (3, 13)),
    _add_rmsnorm_case(),
    *_linear_cases(),
]

# the in-place residual placements (their own module: they are generated, not listed)
from inplace_cases import INPLACE_CASES  # noqa: E402  pylint: disable=wrong-import-position

OP_CASES += INPLACE_CASES

CASE_IDS = [c.id for c in OP_CASES]


# ---- custom ops whose numerics are tested outside the op-case harness ---------------------------
# Each entry: sample(dtype) -> list of (custom op, args); test_conformance runs opcheck on every
# sample and counts these ops as covered. The quantize family has no te.ops operation yet; its
# numerics are in tests/test_fp8_quantize.py.


def _samples_quantize(dtype):
    out = []
    for shape in [(1, 64), (2, 3, 64), (0, 64)]:
        x = _rand(*shape, dtype=dtype)
        for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
            out.append((te_ops.fp8_quantize, (x, fmt, False, 0.0)))
            out.append((te_ops.fp8_quantize, (x, fmt, True, 1e-3)))
            out.append((te_ops.fp8_quantize_scaled, (x, torch.tensor([3.0]), fmt)))
            data, scale_inv, _ = te_ops.fp8_quantize(x, fmt, False, 0.0)
            out.append((te_ops.fp8_dequantize, (data, scale_inv, fmt, dtype)))
            mx, sc = te_ops.mxfp8_quantize(x, fmt)
            out.append((te_ops.mxfp8_quantize, (x, fmt)))
            out.append((te_ops.mxfp8_dequantize, (mx, sc, fmt, dtype)))
    # delayed scaling's in-place update (fp32 state whatever the compute dtype)
    for algo, shape in (("max", (5, 3)), ("most_recent", (1, 2)), ("max", (4, 0))):
        h = torch.rand(*shape) * 100
        out.append((te_ops.fp8_delayed_scaling_update, (h, torch.rand(shape[1]) + 0.5, 448.0, 1,
                                                        algo)))
    # a non-contiguous (transposed) input
    xt = _rand(64, 32, dtype=dtype).t()
    out.append((te_ops.fp8_quantize, (xt, torch.float8_e4m3fn, False, 0.0)))
    out.append((te_ops.mxfp8_quantize, (xt, torch.float8_e4m3fn)))
    return _with_non_contiguous(out)


def _samples_fp8_gemm(dtype):
    """te_cpp.fp8_gemm (the FP8 linear's forward GEMM; numerics in tests/test_fp8_ops.py): k and
    n multiples of 16 and never E5M2 x E5M2, so the samples also fit cuBLASLt's FP8 GEMM."""
    out = []
    w = _rand(32, 64, dtype=dtype)
    for shape in [(1, 64), (2, 3, 64), (0, 64)]:
        x = _rand(*shape, dtype=dtype)
        for fx, fw in ((torch.float8_e4m3fn, torch.float8_e4m3fn),
                       (torch.float8_e5m2, torch.float8_e4m3fn)):
            xd, xs, _ = te_ops.fp8_quantize(x, fx, False, 0.0)
            wd, ws, _ = te_ops.fp8_quantize(w, fw, False, 0.0)
            out.append((te_ops.fp8_gemm, (xd, xs, fx, wd, ws, fw, dtype)))
            # with the bias epilogue (the bias in the output dtype)
            out.append((te_ops.fp8_gemm, (xd, xs, fx, wd, ws, fw, dtype, _rand(32, dtype=dtype))))
            # mxfp8_gemm: the same shapes with MXFP8 operands (blocks of 32 along k)
            xm, xe = te_ops.mxfp8_quantize(x, fx)
            wm, we = te_ops.mxfp8_quantize(w, fw)
            out.append((te_ops.mxfp8_gemm, (xm, xe, fx, wm, we, fw, dtype)))
    return _with_non_contiguous(out)


def _samples_fp8_amax(dtype):
    """te_cpp.fp8_amax: fp8_quantize's amax alone (numerics in tests/test_fp8_quantize.py)."""
    out = [(te_ops.fp8_amax, (_rand(*shape, dtype=dtype),))
           for shape in [(1, 64), (2, 3, 64), (0, 64), (5,)]]
    out.append((te_ops.fp8_amax, (_rand(64, 32, dtype=dtype).t(),)))  # transposed
    return _with_non_contiguous(out)


def _samples_fp8_current_scale(dtype):
    """te_cpp.fp8_current_scale: the scale from an fp32 amax of one element (whatever the
    compute dtype; shape [1] as fp8_amax returns it, or 0-d), both formats, pow2, epsilon."""
    out = []
    for amax in (torch.tensor([3.5]), torch.tensor(0.0), torch.tensor([[float("nan")]]),
                 torch.tensor([1e-30])):
        for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
            out.append((te_ops.fp8_current_scale, (amax, fmt, False, 0.0)))
            out.append((te_ops.fp8_current_scale, (amax, fmt, True, 1e-3)))
    return out


def _samples_grouped(dtype):
    """The grouped family (GroupedLinear; numerics in tests/test_grouped_ops.py): uneven splits
    with an empty and a one-row group, all rows in one group, one group, and no rows; with and
    without biases and bias scales (float32 and the compute dtype)."""
    out = []
    in_f, out_f = 6, 5
    for splits in ([3, 0, 1, 4], [0, 7, 0], [5], [0, 0]):
        groups, rows = len(splits), sum(splits)
        split_sizes = torch.tensor(splits, dtype=torch.int64)
        x = _rand(rows, in_f, dtype=dtype)
        dy = _rand(rows, out_f, dtype=dtype)
        weights = [_rand(out_f, in_f, dtype=dtype) for _ in range(groups)]
        biases = [_rand(out_f, dtype=dtype) for _ in range(groups)]
        for scales in (torch.rand(rows) + 0.5, (torch.rand(rows) + 0.5).to(dtype)):
            out.append((te_ops.grouped_linear_fwd, (x, split_sizes, weights, biases, scales)))
            out.append((te_ops.grouped_bias_bwd, (dy, split_sizes, biases, scales, dtype)))
        out.append((te_ops.grouped_linear_fwd, (x, split_sizes, weights, biases, None)))
        out.append((te_ops.grouped_linear_fwd, (x, split_sizes, weights, [], None)))
        out.append((te_ops.grouped_linear_dgrad, (dy, split_sizes, weights)))
        out.append((te_ops.grouped_linear_wgrad, (dy, x, split_sizes)))
        out.append((te_ops.grouped_bias_bwd, (dy, split_sizes, [], None, torch.float32)))
        out.append((te_ops.grouped_bias_bwd, (dy, split_sizes, biases, None, dtype)))
    # the per-group quantize ops (numerics in tests/test_grouped_fp8.py): current scaling with
    # an epsilon per group, delayed scaling's given scales, both formats; MXFP8 with splits of
    # 32 rows (the columnwise copy) and any split rowwise-only
    for splits in ([3, 0, 1, 4], [0, 7, 0], [0, 0]):
        groups, rows = len(splits), sum(splits)
        split_sizes = torch.tensor(splits, dtype=torch.int64)
        x = _rand(rows, 16, dtype=dtype)
        for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
            eps = [0.0] * groups
            out.append((te_ops.grouped_fp8_quantize, (x, split_sizes, None, fmt, False, eps)))
            out.append((te_ops.grouped_fp8_quantize,
                        (x, split_sizes, torch.rand(groups) + 0.5, fmt, False, eps)))
            data, scale_inv, _ = te_ops.grouped_fp8_quantize(x, split_sizes, None, fmt, True,
                                                             [1e-3] * groups)
            out.append((te_ops.grouped_fp8_dequantize, (data, split_sizes, scale_inv, fmt, dtype)))
            ws = [te_ops.fp8_quantize(_rand(8, 16, dtype=dtype), fmt, False, 0.0)
                  for _ in range(groups)]
            wd, wsi = [w[0] for w in ws], [w[1] for w in ws]
            bs = [_rand(8, dtype=dtype) for _ in range(groups)]
            out.append((te_ops.grouped_fp8_linear_fwd,
                        (data, scale_inv, fmt, split_sizes, wd, wsi, fmt, bs, None, dtype)))
            out.append((te_ops.grouped_fp8_linear_fwd,
                        (data, scale_inv, fmt, split_sizes, wd, wsi, fmt, bs,
                         torch.rand(rows) + 0.5, torch.float32)))
            out.append((te_ops.grouped_fp8_linear_fwd,
                        (data, scale_inv, fmt, split_sizes, wd, wsi, fmt, [], None, dtype)))
        out.append((te_ops.grouped_mxfp8_quantize,
                    (_rand(rows, 32, dtype=dtype), split_sizes, torch.float8_e4m3fn, True, False)))
    for splits in ([32, 0, 64], [0, 0]):
        x = _rand(sum(splits), 64, dtype=dtype)
        split_sizes = torch.tensor(splits, dtype=torch.int64)
        for rowwise in (True, False):
            out.append((te_ops.grouped_mxfp8_quantize,
                        (x, split_sizes, torch.float8_e5m2, rowwise, True)))
    # Float8BlockScaling per group (partial blocks and tiles, both copies) and NVFP4 per group
    # (the columnwise copy with splits of 16 rows, the transform, a seed per group)
    for splits in ([130, 0, 3], [0, 0]):
        split_sizes = torch.tensor(splits, dtype=torch.int64)
        x = _rand(sum(splits), 144, dtype=dtype)
        for block_dim, columnwise in ((1, False), (2, False), (1, True), (2, True)):
            args = (torch.float8_e4m3fn, block_dim, True, 0.0, columnwise)
            out.append((te_ops.grouped_fp8_block_quantize, (x, split_sizes, *args)))
            data, scale = te_ops.grouped_fp8_block_quantize(x, split_sizes, *args)
            out.append((te_ops.grouped_fp8_block_dequantize,
                        (data, split_sizes, scale, torch.float8_e4m3fn, block_dim, columnwise,
                         dtype)))
    for splits in ([16, 0, 32], [0, 0]):
        split_sizes = torch.tensor(splits, dtype=torch.int64)
        x = _rand(sum(splits), 32, dtype=dtype)
        seeds = torch.arange(len(splits), dtype=torch.int64) + 7
        for columnwise, rht, block_2d, sr in ((False, False, False, None),
                                              (True, True, False, seeds),
                                              (True, False, True, None)):
            out.append((te_ops.grouped_nvfp4_quantize,
                        (x, split_sizes, columnwise, rht, block_2d, sr)))
            data, scale, amax = te_ops.grouped_nvfp4_quantize(x, split_sizes, columnwise, rht,
                                                              block_2d, sr)
            out.append((te_ops.grouped_nvfp4_dequantize,
                        (data, split_sizes, scale, amax, columnwise, rht, dtype)))
    return _with_non_contiguous(out)


def _samples_nvfp4(dtype):
    """te_cpp.nvfp4_quantize / nvfp4_dequantize (numerics in tests/test_nvfp4.py): 1-D and
    2-D blocks, the transform, stochastic rounding, zero size, a transposed input."""
    out = []
    seed = torch.tensor(1234, dtype=torch.int64)
    for shape in [(1, 64), (2, 3, 32), (0, 64), (17, 16)]:
        x = _rand(*shape, dtype=dtype)
        for rht, block_2d, sr in ((False, False, None), (True, False, seed),
                                  (False, True, None)):
            out.append((te_ops.nvfp4_quantize, (x, rht, block_2d, sr)))
            data, scale, amax = te_ops.nvfp4_quantize(x, rht, block_2d, sr)
            out.append((te_ops.nvfp4_dequantize, (data, scale, amax, rht, dtype)))
    out.append((te_ops.nvfp4_quantize, (_rand(64, 32, dtype=dtype).t(), True, True, None)))
    return _with_non_contiguous(out)


def _samples_fp8_block(dtype):
    """Float8BlockScaling's quantize ops (numerics in tests/test_fp8_block_scaling.py): 1x128
    and 128x128 blocks, partial blocks at the edges, 1-D and 3-D, empty tensors."""
    out = []
    for shape in [(1, 64), (2, 3, 130), (130,), (0, 64), (3, 0)]:
        x = _rand(*shape, dtype=dtype)
        for fmt, dim, pow2, eps in ((torch.float8_e4m3fn, 1, True, 0.0),
                                    (torch.float8_e5m2, 2, False, 1e-3)):
            out.append((te_ops.fp8_block_quantize, (x, fmt, dim, pow2, eps)))
            data, scale_inv = te_ops.fp8_block_quantize(x, fmt, dim, pow2, eps)
            out.append((te_ops.fp8_block_dequantize, (data, scale_inv, fmt, dim, dtype)))
    xt = _rand(140, 20, dtype=dtype).t()  # a non-contiguous (transposed) input
    out.append((te_ops.fp8_block_quantize, (xt, torch.float8_e4m3fn, 1, True, 0.0)))
    return _with_non_contiguous(out)


def _samples_transpose_2d(dtype):
    """te_cpp.transpose_2d (numerics, float8 dtypes included, in tests/test_transpose.py): the
    compute dtype and the raw bytes of the quantized tensors (uint8; opcheck's schema check
    cannot compare float8 tensors), vectors, an odd shape, zero size, a transposed
    (non-contiguous) input."""
    out = []
    for shape in [(1, 64), (37, 129), (64, 1), (0, 64), (3, 0)]:
        x = _rand(*shape, dtype=dtype)
        out.append((te_ops.transpose_2d, (x,)))
        out.append((te_ops.transpose_2d, (torch.randint(0, 256, shape, dtype=torch.uint8),)))
    out.append((te_ops.transpose_2d, (_rand(64, 48, dtype=dtype).t(),)))
    return _with_non_contiguous(out)


def _samples_random_seeds(dtype):
    """te_cpp.random_seeds (its draws, eager against compiled, in tests/test_random_seeds.py):
    ``like`` only names the device, so its dtype, shape (zero size included) and strides vary;
    no seeds, one, several."""
    like = _rand(4, 6, dtype=dtype)
    out = [(te_ops.random_seeds, (like, n)) for n in (0, 1, 3)]
    out.append((te_ops.random_seeds, (_rand(0, 6, dtype=dtype), 2)))
    out.append((te_ops.random_seeds, (torch.empty(3, 0, dtype=torch.uint8), 1)))
    return _with_non_contiguous(out)


STANDALONE_OPCHECK_SAMPLES = {"quantize": _samples_quantize, "fp8_gemm": _samples_fp8_gemm,
                              "fp8_amax": _samples_fp8_amax,
                              "fp8_current_scale": _samples_fp8_current_scale,
                              "grouped": _samples_grouped, "nvfp4": _samples_nvfp4,
                              "fp8_block": _samples_fp8_block,
                              "transpose_2d": _samples_transpose_2d,
                              "random_seeds": _samples_random_seeds}

#: Custom ops whose tensor arguments always have exactly one element, so no zero-size and no
#: non-contiguous sample of them exists (a tensor of one element is contiguous whatever its
#: strides), with the reason.
ONE_ELEMENT_OPS: dict[str, str] = {
    "fp8_current_scale": "its one tensor argument, amax, must have exactly one element",
}
