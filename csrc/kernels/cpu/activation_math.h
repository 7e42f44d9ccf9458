// The activation functions and their derivatives, written once over at::vec::Vectorized<A>
// (A = float, or double for fp64 inputs). Each functor holds its constants as vectors, built
// once per kernel call.
//   f(x)                value
// "act" functors (unary activations, and the first half a of a gated one):
//   grad(x, g, f, gx)   value f(x) and the input gradient gx = g * f'(x), for an incoming
//                       gradient g (dy, or dy * lin(b) for a gated activation)
// "lin" functors (the second half b of a gated activation, y = act(a) * lin(b)):
//   both(x, f, df)      value and derivative; grad(x, g, df) the input gradient for g.
//
// NaN/inf semantics are PyTorch autograd's on the reference formulas
// (transformer_engine_cpp/testing/reference.py): g enters the product terms first, as autograd
// multiplies it in (so g = inf meeting a zero factor gives NaN, never a finite or infinite
// value PyTorch does not give), and piecewise derivatives (ReLU, clamps) select, as
// threshold_backward / clamp_backward do: 0 where the input is outside the active range even if
// g is NaN or inf. The vector body and the row tails run the same code.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <limits>
#include <type_traits>

#include "ops/activation.h"

namespace te_cpp::cpu {

template <typename A>
using V = at::vec::Vectorized<A>;

// exp(x). fp32 (and bf16/fp16, computed in fp32) uses at::vec's polynomial exp_u20 (a few ulp,
// several times faster than Sleef's u10 exp), with the edge cases made to match std::exp:
// exp_u20 clamps its argument to the finite range (x > ln(FLT_MAX) would give a finite value,
// NaN a finite value), so those lanes are set to +inf and NaN. fp64 keeps the full-precision exp.
template <typename A>
inline V<A> exp_fast(const V<A>& x) {
  if constexpr (std::is_same_v<A, float>) {
    const V<A> e = x.exp_u20();
    const V<A> big = V<A>::blendv(e, V<A>(std::numeric_limits<float>::infinity()),
                                  x > V<A>(88.72283935546875f));
    return V<A>::blendv(big, x, x != x);
  } else {
    return x.exp();
  }
}

// 1 / (1 + exp(-x)): exactly 0 where exp(-x) overflows (x very negative), NaN for NaN.
// AVX-512 fp32: exp_u20 (clamped, so 1 + e is finite) and the reciprocal from rcp14 plus one
// Newton step (a few ulp, no division); the overflow and NaN lanes are then set as std::exp
// and a division would give them. Otherwise a division after exp_fast.
// kNaN = false skips the NaN lanes' fix-up (the value there is then some finite number): for
// callers whose result is a product with x (x sigmoid(a x), ...), NaN already propagates.
template <typename A, bool kNaN = true>
inline V<A> sigmoid(const V<A>& x) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<A, float>) {
    const __m512 xv = x;
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 nx = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(xv), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
    const __m512 d = _mm512_add_ps(one, V<A>(nx).exp_u20());
    __m512 r = _mm512_rcp14_ps(d);
    r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);  // r (2 - d r)
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(nx, _mm512_set1_ps(88.72283935546875f),
                                                 _CMP_GT_OQ),
                           _mm512_setzero_ps());
    if constexpr (!kNaN) return r;
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q), xv);
  }
#endif
  const V<A> one(A(1));
  return one / (one + exp_fast<A>(x.neg()));
}

template <typename A>
struct Identity {
  explicit Identity(const ActConfig&) {}
  V<A> f(const V<A>& x) const { return x; }
  void both(const V<A>& x, V<A>& f, V<A>& df) const {
    f = x;
    df = V<A>(A(1));
  }
  V<A> grad(const V<A>&, const V<A>& g, const V<A>&) const { return g; }
};

// tanh approximation: 0.5 x (1 + tanh(k0 (x + k1 x^3))), computed as x sigmoid(2u) with
// u = k0 (x + k1 x^3) (0.5 (1 + tanh(u)) = sigmoid(2u)): one exp and one division instead of a
// tanh. The derivative comes from the same sigmoid s:
//   d/dx = s + x s (1 - s) (2u)',  (2u)' = 2 k0 (1 + 3 k1 x^2).
// Limits as the tanh form: x -> +inf gives x, x -> -inf gives -inf * 0 = NaN (as the
// reference), large negative finite x gives -0.
template <typename A>
struct Gelu {
  const V<A> one{A(1)}, c1{A(2 * 0.7978845608028654)}, c2{A(2 * 0.7978845608028654 * 0.044715)},
      c2x3{A(3 * 2 * 0.7978845608028654 * 0.044715)};
  explicit Gelu(const ActConfig&) {}
  V<A> f(const V<A>& x) const {
    // 2u = x (c1 + c2 x^2)
    return x * sigmoid<A, false>(x * at::vec::fmadd(x * x, c2, c1));
  }
  // g * f'(x), as PyTorch's tanh-GELU backward (g times the derivative)
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    const V<A> x2 = x * x;
    const V<A> s = sigmoid<A, false>(x * at::vec::fmadd(x2, c2, c1));
    f = x * s;
    gx = g * at::vec::fmadd(f * (one - s), at::vec::fmadd(x2, c2x3, c1), s);
  }
};

// max(x, 0) as at::vec::clamp_min: one max instruction that returns x where x is NaN (so NaN
// propagates, as at::vec::maximum's three-instruction form). The gradient is threshold_backward's
// on the output: 0 where relu(x) <= 0, else g (so x = NaN passes g through).
template <typename A>
struct Relu {
  const V<A> zero{A(0)};
  explicit Relu(const ActConfig&) {}
  V<A> f(const V<A>& x) const { return at::vec::clamp_min(x, zero); }
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    f = at::vec::clamp_min(x, zero);
    gx = V<A>::blendv(g, zero, x <= zero);
  }
};

// x * sigmoid(alpha x): SiLU with alpha = 1, QGELU with alpha = 1.702.
// g x s'(alpha x) alpha with g multiplied in first, as autograd of x * sigmoid(alpha x) does:
//   gx = g s + ((g x) (1 - s) s) alpha
template <typename A>
inline V<A> scaled_silu_grad(const V<A>& x, const V<A>& g, const V<A>& s, const V<A>& one,
                             const V<A>& alpha) {
  return at::vec::fmadd((g * x) * (one - s) * s, alpha, g * s);
}

template <typename A>
struct ScaledSilu {
  const V<A> one{A(1)}, alpha;
  ScaledSilu(const ActConfig&, A a) : alpha(a) {}
  // x NaN: f and gx are NaN through the products with x
  V<A> f(const V<A>& x) const { return x * sigmoid<A, false>(alpha * x); }
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    const V<A> s = sigmoid<A, false>(alpha * x);
    f = x * s;
    gx = scaled_silu_grad(x, g, s, one, alpha);
  }
};

template <typename A>
struct Silu : ScaledSilu<A> {
  explicit Silu(const ActConfig& c) : ScaledSilu<A>(c, A(1)) {}
};

template <typename A>
struct QGelu : ScaledSilu<A> {
  explicit QGelu(const ActConfig& c) : ScaledSilu<A>(c, A(1.702)) {}
};

// relu(x)^2
template <typename A>
struct SRelu {
  const V<A> zero{A(0)}, two{A(2)};
  explicit SRelu(const ActConfig&) {}
  V<A> f(const V<A>& x) const {
    const V<A> r = at::vec::clamp_min(x, zero);  // NaN propagates (see Relu)
    return r * r;
  }
  // (g * 2r), then threshold_backward's select: 0 where relu(x) <= 0
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    const V<A> r = at::vec::clamp_min(x, zero);
    f = r * r;
    gx = V<A>::blendv(g * (two * r), zero, x <= zero);
  }
};

template <typename A>
struct Sigmoid {
  const V<A> one{A(1)};
  explicit Sigmoid(const ActConfig&) {}
  V<A> f(const V<A>& x) const { return sigmoid<A>(x); }
  // sigmoid_backward: g (1 - s) s
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    f = sigmoid<A>(x);
    gx = g * (one - f) * f;
  }
};

// ClampedSwiGLU's act half: a' = min(a, limit); a' * sigmoid(alpha a').
template <typename A>
struct ClampedSilu {
  const V<A> zero{A(0)}, one{A(1)}, limit, alpha;
  explicit ClampedSilu(const ActConfig& c) : limit(A(c.p0)), alpha(A(c.p1)) {}
  V<A> f(const V<A>& x) const {
    const V<A> c = at::vec::minimum(x, limit);
    return c * sigmoid<A>(alpha * c);
  }
  // clamp_backward's select: 0 where x > limit or x is NaN
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    const V<A> c = at::vec::minimum(x, limit);
    const V<A> s = sigmoid<A>(alpha * c);
    f = c * s;
    gx = V<A>::blendv(zero, scaled_silu_grad(c, g, s, one, alpha), x <= limit);
  }
};

// ClampedSwiGLU's linear half: clamp(b, -limit, limit) + offset.
template <typename A>
struct ClampOffset {
  const V<A> zero{A(0)}, one{A(1)}, limit, neg_limit, offset;
  explicit ClampOffset(const ActConfig& c)
      : limit(A(c.p0)), neg_limit(A(-c.p0)), offset(A(c.p2)) {}
  V<A> f(const V<A>& x) const { return at::vec::clamp(x, neg_limit, limit) + offset; }
  void both(const V<A>& x, V<A>& f, V<A>& df) const {
    f = at::vec::clamp(x, neg_limit, limit) + offset;
    df = V<A>::blendv(zero, one, (x >= neg_limit) & (x <= limit));
  }
  // clamp_backward's select: 0 outside [-limit, limit] (and for NaN x) whatever g is
  V<A> grad(const V<A>& x, const V<A>& g, const V<A>&) const {
    return V<A>::blendv(zero, g, (x >= neg_limit) & (x <= limit));
  }
};

// SiTUGLU's act half: beta1 tanh(a / beta1) sigmoid(a).
template <typename A>
struct SiTU {
  const V<A> one{A(1)}, beta, inv_beta;
  explicit SiTU(const ActConfig& c) : beta(A(c.p0)), inv_beta(A(1.0 / c.p0)) {}
  V<A> f(const V<A>& x) const { return beta * (x * inv_beta).tanh() * sigmoid<A>(x); }
  // autograd of (beta t) s: (g s)(1 - t^2) + (g (beta t))(1 - s) s
  void grad(const V<A>& x, const V<A>& g, V<A>& f, V<A>& gx) const {
    const V<A> t = (x * inv_beta).tanh();
    const V<A> s = sigmoid<A>(x);
    const V<A> bt = beta * t;
    f = bt * s;
    gx = at::vec::fmadd(g * s, one - t * t, (g * bt) * (one - s) * s);
  }
};

// SiTUGLU's linear half: beta2 tanh(b / beta2).
template <typename A>
struct TanhScaled {
  const V<A> one{A(1)}, beta, inv_beta;
  explicit TanhScaled(const ActConfig& c) : beta(A(c.p1)), inv_beta(A(1.0 / c.p1)) {}
  V<A> f(const V<A>& x) const { return beta * (x * inv_beta).tanh(); }
  void both(const V<A>& x, V<A>& f, V<A>& df) const {
    const V<A> t = (x * inv_beta).tanh();
    f = beta * t;
    df = one - t * t;
  }
  V<A> grad(const V<A>&, const V<A>& g, const V<A>& df) const { return g * df; }
};

// Act -> (act functor, lin functor). Unary activations use only `Act`.
template <Act K, typename A> struct ActTraits;
#define TE_ACT_TRAITS(K, ACT, LIN)          \
  template <typename A>                     \
  struct ActTraits<K, A> {                  \
    using Act = ACT<A>;                     \
    using Lin = LIN<A>;                     \
  };
TE_ACT_TRAITS(Act::GELU, Gelu, Identity)
TE_ACT_TRAITS(Act::RELU, Relu, Identity)
TE_ACT_TRAITS(Act::SILU, Silu, Identity)
TE_ACT_TRAITS(Act::QGELU, QGelu, Identity)
TE_ACT_TRAITS(Act::SRELU, SRelu, Identity)
TE_ACT_TRAITS(Act::GLU, Sigmoid, Identity)
TE_ACT_TRAITS(Act::GEGLU, Gelu, Identity)
TE_ACT_TRAITS(Act::QGEGLU, QGelu, Identity)
TE_ACT_TRAITS(Act::REGLU, Relu, Identity)
TE_ACT_TRAITS(Act::SREGLU, SRelu, Identity)
TE_ACT_TRAITS(Act::SWIGLU, Silu, Identity)
TE_ACT_TRAITS(Act::CLAMPED_SWIGLU, ClampedSilu, ClampOffset)
TE_ACT_TRAITS(Act::SITUGLU, SiTU, TanhScaled)
#undef TE_ACT_TRAITS

}  // namespace te_cpp::cpu
