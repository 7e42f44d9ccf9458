// The primitive operations of the shared math (common/activation_math.h, common/norm_math.h).
//
// The activation and norm formulas are written once, as C10_HOST_DEVICE templates over a value
// type V, with plain arithmetic (+ - * /, comparisons) and the primitives of Ops<V>:
//   V = float or double   this header; valid in host and CUDA device code (the CUDA kernels
//                         run the formulas on float, one element per thread);
//   V = at::vec::Vectorized<float / double>   kernels/cpu/vec_math.h (the CPU kernels run
//                         them on vectors of the accumulation type).
// So the formula the CPU suite tests is the one the CUDA kernels run; what differs between the
// instantiations is the primitives' implementation (at::vec's polynomial exp against expf, ...),
// never the formula.
//
// Each primitive states its semantics for NaN and signed zeros; the vector specialisation
// implements the same semantics (see kernels/cpu/vec_math.h). A comparison gives Ops<V>::Mask
// (bool for a scalar, a lane mask for a vector).
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>

// Every function of the shared math is forced inline: it runs per element or per vector in a
// kernel's inner loop, where a call costs more than the arithmetic. Left to its heuristics, GCC
// keeps some instantiations out of line in the large kernels that dispatch over every Act.
#if defined(__CUDACC__)
#define TE_MATH C10_HOST_DEVICE __forceinline__
#else
#define TE_MATH C10_ALWAYS_INLINE
#endif

namespace te_cpp::math {

// Specialised for each value type (no primary definition).
template <typename V>
struct Ops;

namespace detail {
// The libm / CUDA math functions by precision (the global ones: std:: functions are host-only
// in device code).
TE_MATH float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
TE_MATH double fma(double a, double b, double c) { return ::fma(a, b, c); }
TE_MATH float exp(float x) { return ::expf(x); }
TE_MATH double exp(double x) { return ::exp(x); }
TE_MATH float tanh(float x) { return ::tanhf(x); }
TE_MATH double tanh(double x) { return ::tanh(x); }
TE_MATH float sqrt(float x) { return ::sqrtf(x); }
TE_MATH double sqrt(double x) { return ::sqrt(x); }
}  // namespace detail

template <typename A>
struct ScalarOps {
  using Scalar = A;
  using Mask = bool;

  // a * b + c with one rounding
  static TE_MATH A fma(A a, A b, A c) { return detail::fma(a, b, c); }
  // c - a * b with one rounding
  static TE_MATH A fnma(A a, A b, A c) { return detail::fma(-a, b, c); }
  // max(x, lo) that returns x when x is NaN, and x for x = -0, lo = +0 (as x86's max(lo, x))
  static TE_MATH A clamp_min(A x, A lo) { return lo > x ? lo : x; }
  // min(x, y), NaN when either is NaN; y when they compare equal (+0 / -0)
  static TE_MATH A minimum(A x, A y) {
    return x != x ? x : (y != y ? y : (x < y ? x : y));
  }
  // min(hi, max(lo, x)): NaN x stays NaN
  static TE_MATH A clamp(A x, A lo, A hi) {
    const A t = lo > x ? lo : x;
    return hi < t ? hi : t;
  }
  // m ? if_true : if_false (a select, so a NaN or inf in the unselected value never leaks)
  static TE_MATH A select(bool m, A if_true, A if_false) { return m ? if_true : if_false; }
  static TE_MATH bool both(bool a, bool b) { return a && b; }
  static TE_MATH A exp(A x) { return detail::exp(x); }
  static TE_MATH A tanh(A x) { return detail::tanh(x); }
  static TE_MATH A sqrt(A x) { return detail::sqrt(x); }
  // 1 / (1 + exp(-x)): 0 where exp(-x) overflows, NaN for NaN x
  static TE_MATH A sigmoid(A x) { return A(1) / (A(1) + detail::exp(-x)); }
};

template <>
struct Ops<float> : ScalarOps<float> {};
template <>
struct Ops<double> : ScalarOps<double> {};

// Classification in plain arithmetic (valid in host and device code, no std:: calls).
template <typename A>
TE_MATH bool is_nan(A v) {
  return v != v;
}
// false for +-inf and NaN (v - v is NaN for both)
template <typename A>
TE_MATH bool is_finite(A v) {
  return v - v == A(0);
}
template <typename A>
TE_MATH bool is_inf(A v) {
  return !is_nan(v) && !is_finite(v);
}

}  // namespace te_cpp::math
