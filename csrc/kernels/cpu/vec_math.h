// The primitives of the shared math (common/math_ops.h) on at::vec::Vectorized<A> (A = float,
// or double for fp64 inputs), so the CPU kernels run the formulas of common/activation_math.h
// and common/norm_math.h on whole vectors. Each primitive keeps the scalar one's semantics
// (NaN, signed zeros, overflow); only exp and the reciprocal in sigmoid are computed
// differently (a few ulp in fp32, see exp_fast and sigmoid).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <limits>
#include <type_traits>

#include "common/math_ops.h"

namespace te_cpp::cpu {

template <typename A>
using V = at::vec::Vectorized<A>;

// exp(x). fp32 (and bf16/fp16, computed in fp32) uses at::vec's polynomial exp_u20 (a few ulp,
// several times faster than Sleef's u10 exp), with the edge cases made to match std::exp:
// exp_u20 clamps its argument to the finite range (x > ln(FLT_MAX) would give a finite value,
// NaN a finite value), so those lanes are set to +inf and NaN. fp64 keeps the full-precision exp.
template <typename A>
C10_ALWAYS_INLINE V<A> exp_fast(const V<A>& x) {
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
C10_ALWAYS_INLINE V<A> sigmoid(const V<A>& x) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<A, float>) {
    const __m512 xv = x;
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 nx = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(xv), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
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

}  // namespace te_cpp::cpu

namespace te_cpp::math {

// Ops on vectors: comparisons give lane masks (all bits set where true), select blends.
template <typename A>
struct Ops<at::vec::Vectorized<A>> {
  using V = at::vec::Vectorized<A>;
  using Scalar = A;
  using Mask = V;

  static C10_ALWAYS_INLINE V fma(const V& a, const V& b, const V& c)
      { return at::vec::fmadd(a, b, c); }
  static C10_ALWAYS_INLINE V fnma(const V& a, const V& b, const V& c)
      { return at::vec::fnmadd(a, b, c); }
  // max(lo, x) in one instruction that returns x when x is NaN (x86 max returns its second
  // operand for NaN and for equal operands)
  static C10_ALWAYS_INLINE V clamp_min(const V& x, const V& lo)
      { return at::vec::clamp_min(x, lo); }
  // NaN when either is NaN (as an all-ones NaN)
  static C10_ALWAYS_INLINE V minimum(const V& x, const V& y) { return at::vec::minimum(x, y); }
  static C10_ALWAYS_INLINE V clamp(const V& x, const V& lo, const V& hi)
      { return at::vec::clamp(x, lo, hi); }
  static C10_ALWAYS_INLINE V select(const V& m, const V& if_true, const V& if_false) {
    return V::blendv(if_false, if_true, m);
  }
  static C10_ALWAYS_INLINE V both(const V& a, const V& b) { return a & b; }
  static C10_ALWAYS_INLINE V exp(const V& x) { return cpu::exp_fast<A>(x); }
  static C10_ALWAYS_INLINE V tanh(const V& x) { return x.tanh(); }
  static C10_ALWAYS_INLINE V sqrt(const V& x) { return x.sqrt(); }
  static C10_ALWAYS_INLINE V sigmoid(const V& x) { return cpu::sigmoid<A>(x); }
  static C10_ALWAYS_INLINE V sigmoid_in_product(const V& x) { return cpu::sigmoid<A, false>(x); }
};

}  // namespace te_cpp::math
