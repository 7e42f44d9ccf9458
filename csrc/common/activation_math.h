// The activation functions and their derivatives, written once for every backend: C10_HOST_DEVICE
// templates over a value type V (see common/math_ops.h): float (or double) in CUDA kernels,
// at::vec::Vectorized<float / double> in the CPU kernels (kernels/cpu/activation_math.h).
//
// Each activation is a functor, built on the host from the call's ActConfig (its parameters
// rounded to the accumulation type once per kernel call) and passed by value to the kernel:
//   f(x)                value
// "act" functors (unary activations, and the first half a of a gated one):
//   grad(x, g, f, gx)   value f(x) and the input gradient gx = g * f'(x), for an incoming
//                       gradient g (dy, or dy * lin(b) for a gated activation)
// "lin" functors (the second half b of a gated activation, y = act(a) * lin(b)):
//   both(x, f, df)      value and derivative; grad(x, g, df) the input gradient for g.
// ActMath<K, V> names the two halves of each Act, Gated<K, V> composes them.
//
// NaN/inf semantics are PyTorch autograd's on the reference formulas
// (transformer_engine_cpp/testing/reference.py): g enters the product terms first, as autograd
// multiplies it in (so g = inf meeting a zero factor gives NaN, never a finite or infinite
// value PyTorch does not give), and piecewise derivatives (ReLU, clamps) select, as
// threshold_backward / clamp_backward do: 0 where the input is outside the active range even if
// g is NaN or inf.
#pragma once

#include <c10/macros/Macros.h>

#include "common/math_ops.h"
#include "ops/activation.h"

namespace te_cpp::math {

template <typename V>
using scalar_of = typename Ops<V>::Scalar;

template <typename V>
struct Identity {
  using A = scalar_of<V>;
  explicit Identity(const ActConfig&) {}
  TE_MATH V f(const V& x) const { return x; }
  TE_MATH void both(const V& x, V& f, V& df) const {
    f = x;
    df = V(A(1));
  }
  TE_MATH V grad(const V&, const V& g, const V&) const { return g; }
};

// tanh approximation: 0.5 x (1 + tanh(k0 (x + k1 x^3))), computed as x sigmoid(2u) with
// u = k0 (x + k1 x^3) (0.5 (1 + tanh(u)) = sigmoid(2u)): one exp and one division instead of a
// tanh. The derivative comes from the same sigmoid s:
//   d/dx = s + x s (1 - s) (2u)',  (2u)' = 2 k0 (1 + 3 k1 x^2).
// Limits as the tanh form: x -> +inf gives x, x -> -inf gives -inf * 0 = NaN (as the
// reference), large negative finite x gives -0.
template <typename V>
struct Gelu {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V one{A(1)}, c1{A(2 * 0.7978845608028654)}, c2{A(2 * 0.7978845608028654 * 0.044715)},
      c2x3{A(3 * 2 * 0.7978845608028654 * 0.044715)};
  explicit Gelu(const ActConfig&) {}
  TE_MATH V f(const V& x) const {
    // 2u = x (c1 + c2 x^2); x NaN: f is NaN through the product with x
    return x * O::sigmoid(x * O::fma(x * x, c2, c1));
  }
  // g * f'(x), as PyTorch's tanh-GELU backward (g times the derivative)
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    const V x2 = x * x;
    const V s = O::sigmoid(x * O::fma(x2, c2, c1));
    f = x * s;
    gx = g * O::fma(f * (one - s), O::fma(x2, c2x3, c1), s);
  }
};

// max(x, 0), NaN propagating. The gradient is threshold_backward's on the output: 0 where
// relu(x) <= 0, else g (so x = NaN passes g through).
template <typename V>
struct Relu {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V zero{A(0)};
  explicit Relu(const ActConfig&) {}
  TE_MATH V f(const V& x) const { return O::clamp_min(x, zero); }
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    f = O::clamp_min(x, zero);
    gx = O::select(x <= zero, zero, g);
  }
};

// The gradient of x * sigmoid(alpha x) for an incoming g, with g multiplied in first, as
// autograd does: gx = g s + ((g x) (1 - s) s) alpha, s = sigmoid(alpha x).
template <typename V>
TE_MATH V scaled_silu_grad(const V& x, const V& g, const V& s, const V& one,
                                          const V& alpha) {
  return Ops<V>::fma((g * x) * (one - s) * s, alpha, g * s);
}

// x * sigmoid(alpha x): SiLU with alpha = 1, QGELU with alpha = 1.702.
template <typename V>
struct ScaledSilu {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V one{A(1)}, alpha;
  ScaledSilu(const ActConfig&, A a) : alpha(a) {}
  // x NaN: f and gx are NaN through the products with x
  TE_MATH V f(const V& x) const { return x * sigmoid_part(x); }
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    grad_from_sigmoid(x, g, sigmoid_part(x), f, gx);
  }
  // The sigmoid f and grad are made of, a function of x alone (the CPU kernels read it from a
  // table for 16-bit inputs), and grad given it.
  TE_MATH V sigmoid_part(const V& x) const { return O::sigmoid(alpha * x); }
  TE_MATH void grad_from_sigmoid(const V& x, const V& g, const V& s, V& f, V& gx) const {
    f = x * s;
    gx = scaled_silu_grad(x, g, s, one, alpha);
  }
};

template <typename V>
struct Silu : ScaledSilu<V> {
  explicit Silu(const ActConfig& c) : ScaledSilu<V>(c, scalar_of<V>(1)) {}
};

template <typename V>
struct QGelu : ScaledSilu<V> {
  explicit QGelu(const ActConfig& c) : ScaledSilu<V>(c, scalar_of<V>(1.702)) {}
};

// relu(x)^2
template <typename V>
struct SRelu {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V zero{A(0)}, two{A(2)};
  explicit SRelu(const ActConfig&) {}
  TE_MATH V f(const V& x) const {
    const V r = O::clamp_min(x, zero);  // NaN propagates (see Relu)
    return r * r;
  }
  // (g * 2r), then threshold_backward's select: 0 where relu(x) <= 0
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    const V r = O::clamp_min(x, zero);
    f = r * r;
    gx = O::select(x <= zero, zero, g * (two * r));
  }
};

// GLU's act half.
template <typename V>
struct Sigmoid {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V one{A(1)};
  explicit Sigmoid(const ActConfig&) {}
  TE_MATH V f(const V& x) const { return O::sigmoid(x); }
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    grad_from_sigmoid(x, g, sigmoid_part(x), f, gx);
  }
  // as ScaledSilu's
  TE_MATH V sigmoid_part(const V& x) const { return O::sigmoid(x); }
  // sigmoid_backward: g (1 - s) s
  TE_MATH void grad_from_sigmoid(const V&, const V& g, const V& s, V& f, V& gx) const {
    f = s;
    gx = g * (one - f) * f;
  }
};

// ClampedSwiGLU's act half: a' = min(a, limit); a' * sigmoid(alpha a').
template <typename V>
struct ClampedSilu {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V zero{A(0)}, one{A(1)}, limit, alpha;
  explicit ClampedSilu(const ActConfig& c) : limit(A(c.p0)), alpha(A(c.p1)) {}
  TE_MATH V f(const V& x) const { return O::minimum(x, limit) * sigmoid_part(x); }
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    grad_from_sigmoid(x, g, sigmoid_part(x), f, gx);
  }
  // as ScaledSilu's
  TE_MATH V sigmoid_part(const V& x) const { return O::sigmoid(alpha * O::minimum(x, limit)); }
  // clamp_backward's select: 0 where x > limit or x is NaN
  TE_MATH void grad_from_sigmoid(const V& x, const V& g, const V& s, V& f, V& gx) const {
    const V c = O::minimum(x, limit);
    f = c * s;
    gx = O::select(x <= limit, scaled_silu_grad(c, g, s, one, alpha), zero);
  }
};

// ClampedSwiGLU's linear half: clamp(b, -limit, limit) + offset.
template <typename V>
struct ClampOffset {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V zero{A(0)}, one{A(1)}, limit, neg_limit, offset;
  explicit ClampOffset(const ActConfig& c)
      : limit(A(c.p0)), neg_limit(A(-c.p0)), offset(A(c.p2)) {}
  TE_MATH V f(const V& x) const { return O::clamp(x, neg_limit, limit) + offset; }
  TE_MATH void both(const V& x, V& f, V& df) const {
    f = O::clamp(x, neg_limit, limit) + offset;
    df = O::select(O::both(x >= neg_limit, x <= limit), one, zero);
  }
  // clamp_backward's select: 0 outside [-limit, limit] (and for NaN x) whatever g is
  TE_MATH V grad(const V& x, const V& g, const V&) const {
    return O::select(O::both(x >= neg_limit, x <= limit), g, zero);
  }
};

// SiTUGLU's act half: beta1 tanh(a / beta1) sigmoid(a).
template <typename V>
struct SiTU {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V one{A(1)}, beta, inv_beta;
  explicit SiTU(const ActConfig& c) : beta(A(c.p0)), inv_beta(A(1.0 / c.p0)) {}
  TE_MATH V f(const V& x) const {
    return beta * tanh_part(x) * sigmoid_part(x);
  }
  TE_MATH void grad(const V& x, const V& g, V& f, V& gx) const {
    grad_from_parts(x, g, tanh_part(x), sigmoid_part(x), f, gx);
  }
  // its two transcendentals, t = tanh(x / beta1) and s = sigmoid(x) (which the CPU kernels read
  // from tables for 16-bit inputs), and the value and gradient made from them: autograd of
  // (beta t) s, (g s)(1 - t^2) + (g (beta t))(1 - s) s
  TE_MATH V tanh_part(const V& x) const { return O::tanh(x * inv_beta); }
  TE_MATH V sigmoid_part(const V& x) const { return O::sigmoid(x); }
  TE_MATH void grad_from_parts(const V&, const V& g, const V& t, const V& s, V& f,
                               V& gx) const {
    const V bt = beta * t;
    f = bt * s;
    gx = O::fma(g * s, one - t * t, (g * bt) * (one - s) * s);
  }
};

// SiTUGLU's linear half: beta2 tanh(b / beta2).
template <typename V>
struct TanhScaled {
  using O = Ops<V>;
  using A = scalar_of<V>;
  const V one{A(1)}, beta, inv_beta;
  explicit TanhScaled(const ActConfig& c) : beta(A(c.p1)), inv_beta(A(1.0 / c.p1)) {}
  TE_MATH V f(const V& x) const { return beta * O::tanh(x * inv_beta); }
  TE_MATH void both(const V& x, V& f, V& df) const {
    const V t = O::tanh(x * inv_beta);
    f = beta * t;
    df = one - t * t;
  }
  TE_MATH V grad(const V&, const V& g, const V& df) const { return g * df; }
};

// Act -> (act functor, lin functor). Unary activations use only `Act` (their `Lin` is the
// unused Identity).
template <Act K, typename V>
struct ActMath;
#define TE_ACT_MATH(K, ACT, LIN) \
  template <typename V>          \
  struct ActMath<K, V> {         \
    using Act = ACT<V>;          \
    using Lin = LIN<V>;          \
  };
TE_ACT_MATH(Act::GELU, Gelu, Identity)
TE_ACT_MATH(Act::RELU, Relu, Identity)
TE_ACT_MATH(Act::SILU, Silu, Identity)
TE_ACT_MATH(Act::QGELU, QGelu, Identity)
TE_ACT_MATH(Act::SRELU, SRelu, Identity)
TE_ACT_MATH(Act::GLU, Sigmoid, Identity)
TE_ACT_MATH(Act::GEGLU, Gelu, Identity)
TE_ACT_MATH(Act::QGEGLU, QGelu, Identity)
TE_ACT_MATH(Act::REGLU, Relu, Identity)
TE_ACT_MATH(Act::SREGLU, SRelu, Identity)
TE_ACT_MATH(Act::SWIGLU, Silu, Identity)
TE_ACT_MATH(Act::CLAMPED_SWIGLU, ClampedSilu, ClampOffset)
TE_ACT_MATH(Act::SITUGLU, SiTU, TanhScaled)
#undef TE_ACT_MATH

// A gated activation y = act(a) * lin(b), for one element pair (a, b) of a row.
template <Act K, typename V>
struct Gated {
  typename ActMath<K, V>::Act act;
  typename ActMath<K, V>::Lin lin;
  explicit Gated(const ActConfig& c) : act(c), lin(c) {}
  TE_MATH V f(const V& a, const V& b) const { return act.f(a) * lin.f(b); }
  // For an incoming gradient g: da = act'(a) applied to g * lin(b), db = lin'(b) applied to
  // g * act(a); fa = act(a) and fb = lin(b) (y = fa * fb) for callers that need the value.
  TE_MATH void grad(const V& a, const V& b, const V& g, V& fa, V& fb, V& da,
                            V& db) const {
    grad_with(b, g, [&](const V& ga, V& f, V& d) { act.grad(a, ga, f, d); }, fa, fb, da, db);
  }
  // grad with the act half's step given: act_grad(ga, fa, da) sets act(a) and its gradient for
  // the incoming ga (act.grad on a, or the CPU kernels' table reads)
  template <typename ActGrad>
  TE_MATH void grad_with(const V& b, const V& g, const ActGrad& act_grad, V& fa, V& fb, V& da,
                         V& db) const {
    V dfb;
    lin.both(b, fb, dfb);
    act_grad(g * fb, fa, da);
    db = lin.grad(b, g * fa, dfb);
  }
};

}  // namespace te_cpp::math
