// The primitives of the shared math (common/math_ops.h) on at::vec::Vectorized<A> (A = float,
// or double for fp64 inputs), so the CPU kernels run the formulas of common/activation_math.h
// and common/norm_math.h on whole vectors. Each primitive keeps the scalar one's semantics
// (NaN, signed zeros, overflow, subnormal results); only exp and the reciprocal in sigmoid are
// computed differently (a few ulp in fp32, see exp_fast and sigmoid).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <limits>
#include <type_traits>

#include "common/math_ops.h"

namespace te_cpp::cpu {

template <typename A>
using V = at::vec::Vectorized<A>;

#if defined(CPU_CAPABILITY_AVX512)
// fp32 exp with AVX-512: x = n ln2 + r with n = round(x log2(e)) (ln2 split in two, so that
// n ln2_hi is exact), exp(r) by a degree-5 minimax polynomial on [-ln2/2, ln2/2] (relative
// error 9e-8; within 2 ulp after rounding), and 2^n applied by vscalefps, which overflows to
// inf and underflows through the subnormals as std::exp does.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // ln2's first 16 bits: n ln2_hi is exact
constexpr float kLn2Lo = 1.42860676533018443e-06f;

// 2^n exp(r), for the n and the reduced r of the argument
C10_ALWAYS_INLINE __m512 exp_from_reduced(__m512 n, __m512 r) {
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.008290245197713375f), r,
                             _mm512_set1_ps(0.04189809784293175f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.1666763871908188f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.4999914765357971f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.9999997019767761f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

C10_ALWAYS_INLINE __m512 round_to_int(__m512 v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// exp(x). x is first clamped to [-104, 89] (exp is 0 or inf beyond), so +-inf give no
// inf - inf; the clamp passes NaN (min / max return their second operand, x, for NaN), and so
// does every later step.
C10_ALWAYS_INLINE __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.f), _mm512_min_ps(_mm512_set1_ps(89.f), x));
  const __m512 n = round_to_int(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)));
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  return exp_from_reduced(n, r);
}
#endif

// exp(x). fp32 (and bf16/fp16, computed in fp32): with AVX-512 exp_avx512 above; otherwise
// at::vec's polynomial exp_u20 (a few ulp, several times faster than Sleef's u10 exp), with the
// edge cases made to match std::exp: exp_u20 clamps its argument to the finite range
// (x > ln(FLT_MAX) would give a finite value, NaN a finite value), so those lanes are set to
// +inf and NaN, and it returns 0 below ln(FLT_MIN), where std::exp is subnormal. fp64 keeps the
// full-precision exp.
template <typename A>
C10_ALWAYS_INLINE V<A> exp_fast(const V<A>& x) {
  if constexpr (std::is_same_v<A, float>) {
#if defined(CPU_CAPABILITY_AVX512)
    return exp_avx512(x);
#else
    const V<A> e = x.exp_u20();
    const V<A> big = V<A>::blendv(e, V<A>(std::numeric_limits<float>::infinity()),
                                  x > V<A>(88.72283935546875f));
    return V<A>::blendv(big, x, x != x);
#endif
  } else {
    return x.exp();
  }
}

// 1 / (1 + exp(-x)): exactly 0 where exp(-x) overflows (x very negative), NaN for NaN.
// AVX-512 fp32: exp(-x) as in exp_avx512, reduced from -x directly, and the reciprocal from
// rcp14 plus one Newton step (a few ulp, no division). x is clamped to <= 104 (exp(-x) is 0
// beyond; NaN passes); where exp(-x) overflows (x <= minus the first fp32 whose exp overflows)
// the Newton step gives NaN, and for x = -inf so does the reduction, so those lanes are set to
// 0, as a division gives. Otherwise a division after exp_fast.
template <typename A>
C10_ALWAYS_INLINE V<A> sigmoid(const V<A>& x) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<A, float>) {
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(104.f), x);
    const __m512 n = round_to_int(_mm512_mul_ps(xc, _mm512_set1_ps(-kLog2e)));
    // r = -x - n ln2: -(n ln2_hi) - x, then - n ln2_lo
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo),
                                      _mm512_fnmsub_ps(n, _mm512_set1_ps(kLn2Hi), xc));
    const __m512 d = _mm512_add_ps(one, exp_from_reduced(n, r));
    __m512 s = _mm512_rcp14_ps(d);
    s = _mm512_fmadd_ps(s, _mm512_fnmadd_ps(d, s, one), s);  // s (2 - d s)
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.72283935546875f),
                                                    _CMP_LE_OQ),
                              _mm512_setzero_ps());
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
};

}  // namespace te_cpp::math
