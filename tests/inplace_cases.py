"""In-place residual placements for the conformance harness (appended to ``OP_CASES``).

``MakeExtraOutput`` and ``AddExtraInput`` joined by a channel bracket ops that save their
input for backward (LayerNorm, BasicLinear, the Bias+activation fusion) or save nothing
(ConstantScale), with every combination of the two ops' ``in_place`` flags; the residual is
also returned to the caller, and a fork feeds a public ``AddExtraInput`` in between. Eager must
equal the float64 reference and compiled must equal eager in each placement.
"""

from __future__ import annotations

import itertools

import transformer_engine_cpp as te
from transformer_engine_cpp.testing import reference as ref

from opcase import OpCase, with_fit_blocks


def _middles(F):
    """(name, make(dtype) -> ops, reference(p, x) of the ops; params from Sequential index 1).
    The branch's output is stored in the working dtype before the residual is added
    (``p.round``), except a BasicLinear's: its GEMM accumulates onto the residual
    (ForwardLinearBiasAdd). Likewise the branch's input gradient is stored before the
    residual's gradient is added (``p.round_grad``), except a BasicLinear's: its dgrad GEMM
    accumulates onto the residual's gradient (BackwardLinearAdd)."""
    return [
        ("LayerNorm", lambda dtype: [te.ops.LayerNorm(F, dtype=dtype)],
         lambda p, x: p.round(ref.layer_norm(p.round_grad(x), p["1.weight"], p["1.bias"]))),
        ("BasicLinear", lambda dtype: [te.ops.BasicLinear(F, F, dtype=dtype)],
         lambda p, x: ref.linear(x, p["1.weight"])),
        # [Bias, GELU] runs as ForwardBiasActivation (saves x and the bias), as in the issue
        ("Bias,GELU,Bias,SiLU",
         lambda dtype: [te.ops.Bias(F, dtype=dtype), te.ops.GELU(),
                        te.ops.Bias(F, dtype=dtype), te.ops.SiLU()],
         lambda p, x: p.round(ref.silu(p.round(p.round_grad(p.round(ref.gelu(
             p.round(p.round_grad(x) + p["1.bias"])))) + p["3.bias"])))),
        ("ConstantScale", lambda dtype: [te.ops.ConstantScale(2.0)],
         lambda p, x: p.round(2.0 * p.round_grad(x))),
    ]


def _residual_case(name, middle, middle_ref, make_in_place, add_in_place, public, F):
    def make(dtype):
        fork = te.ops.MakeExtraOutput(in_place=make_in_place).set_extra_output_channel(
            0, "res", output_to_caller=public)
        join = te.ops.AddExtraInput(in_place=add_in_place).set_extra_input_channel(0, "res")
        return [fork, *middle(dtype), join]

    def reference(p, x):
        # the residual's gradients (the join's dy plus the caller's) are summed in the working
        # dtype before the branch's gradient is added
        residual = p.round_grad(x) if public else x
        out = middle_ref(p, x) + residual
        return (out, residual) if public else out

    flags = f"make_in_place={make_in_place},add_in_place={add_in_place}"
    return OpCase(id=f"Residual[{name}]({flags}{',public' if public else ''})", make=make,
                  reference=reference, features=F)


def _fork_case(make_in_place, public_add_in_place, F):
    """x forks on a channel; a public AddExtraInput between gets its own gradient (dy), not
    the fork's accumulated one."""
    def make(dtype):
        return [te.ops.MakeExtraOutput(in_place=make_in_place).set_extra_output_channel(
                    0, "res", output_to_caller=False),
                te.ops.ConstantScale(3.0),
                te.ops.AddExtraInput(in_place=public_add_in_place),
                te.ops.AddExtraInput(in_place=make_in_place).set_extra_input_channel(0, "res")]

    return OpCase(id=f"Fork[ConstantScale,AddExtraInput](make_in_place={make_in_place},"
                     f"public_add_in_place={public_add_in_place})",
                  make=make,
                  reference=lambda p, x, e: p.round(p.round(3.0 * p.round_grad(x)) + e) + x,
                  features=F,
                  num_extra_inputs=1)


def _cases(F):
    """Every placement at F features."""
    return [
        _residual_case(name, make, reference, mk, ad, False, F)
        for (name, make, reference), (mk, ad) in itertools.product(
            _middles(F), itertools.product((False, True), repeat=2))
    ] + [
        _residual_case(name, make, reference, True, True, True, F)
        for name, make, reference in _middles(F)[:2]
    ] + [_fork_case(mk, ad, F) for mk, ad in itertools.product((False, True), repeat=2)]


#: 24 features; the BasicLinear placements at ``block`` features under a block recipe
INPLACE_CASES: list[OpCase] = with_fit_blocks(_cases, (24,), lambda block: (block,))
