// The row formulas of LayerNorm, RMSNorm and L2Normalization, written once for every backend
// (see common/math_ops.h): the per-row statistics from the row sums, as scalar functions of the
// accumulation type A, and the per-element formulas as TE_MATH templates over a value
// type V (float on CUDA, at::vec::Vectorized<float / double> in the CPU kernels, where a row's
// tail goes through the same code with partial loads).
//
// The row sums themselves (sum x, sum (x - mu)^2, sum x^2, sum g, sum g xhat, sum dy y) are each
// backend's own reduction: their order of summation is not fixed here.
//
//   LayerNorm  mu = mean(x), var = mean((x - mu)^2), rstd = 1 / sqrt(var + eps),
//              y = (x - mu) rstd gamma + beta
//   RMSNorm    var = mean(x^2), rstd as above, y = x rstd gamma
//   backward   g = dy gamma, xhat as in the forward;
//              dx = rstd (g - mean(g) - xhat mean(g xhat)), the mean(g) term LayerNorm's only
//   L2Normalization   rnorm = 1 / sqrt(sum(x^2) + eps), y = x rnorm;
//              dx = rnorm (dy - (dy . y) y)
// gamma is the weight, or 1 + weight with zero_centered_gamma.
//
// The build turns implicit contraction off (-ffp-contract=off, nvcc --fmad=false): a multiply-add
// is fused exactly where the formula says fma / fnma, in every instantiation.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>
#include <limits>

#include "common/math_ops.h"

namespace te_cpp::math {

// The gamma a norm multiplies by: weight, or 1 + weight (zero-centred gamma). Adding 0 in the
// other case keeps one formula (it turns a -0 weight into +0, which scales alike).
template <typename A>
TE_MATH A norm_gamma(A weight, bool zero_centered) {
  return weight + (zero_centered ? A(1) : A(0));
}

// sum / n: the mean from sum(x), the variance from sum((x - mu)^2), the mean square from
// sum(x^2).
template <typename A>
TE_MATH A row_mean(A sum, int64_t n) {
  return sum / static_cast<A>(n);
}

// 1 / sqrt(v + eps): the norms' rstd from the variance (or mean square), and L2Normalization's
// rnorm from sum(x^2). Infinite when v + eps is 0.
template <typename A>
TE_MATH A rsqrt_eps(A v, A eps) {
  return A(1) / Ops<A>::sqrt(v + eps);
}

// xhat = (x - mu) rstd (LayerNorm, kCentered) or x rstd (RMSNorm; mu unused).
template <bool kCentered, typename V>
TE_MATH V norm_xhat(const V& x, const V& mu, const V& rstd) {
  if constexpr (kCentered) {
    return (x - mu) * rstd;
  } else {
    return x * rstd;
  }
}

// y = xhat gamma + beta with one rounding (LayerNorm), or xhat gamma (RMSNorm; beta unused).
template <bool kCentered, typename V>
TE_MATH V norm_out(const V& xhat, const V& gamma, const V& beta) {
  if constexpr (kCentered) {
    return Ops<V>::fma(xhat, gamma, beta);
  } else {
    return xhat * gamma;
  }
}

// The per-row coefficients of the backward, dx = scale (g - c1 - xhat c2).
template <typename A>
struct NormBwdRow {
  A c1;     // mean(g) (LayerNorm), 0 (RMSNorm)
  A c2;     // mean(g xhat)
  A scale;  // rstd, or NaN for a LayerNorm row whose sums are not finite
};

// From the row sums sum_g = sum(g) (LayerNorm only) and sum_gx = sum(g xhat) over n elements.
// LayerNorm: a non-finite row sum (an inf or NaN in the row's dy, or an inf meeting a zero)
// makes the whole dx row NaN, as PyTorch's LayerNorm backward gives (its mixed terms are
// inf - inf there); otherwise some elements would come out as +-inf instead.
// (quiet_NaN is constexpr, so device code may call it: setup.py builds CUDA with
// --expt-relaxed-constexpr.)
template <bool kCentered, typename A>
TE_MATH NormBwdRow<A> norm_bwd_row(A sum_g, A sum_gx, int64_t n, A rstd) {
  NormBwdRow<A> r;
  r.c1 = kCentered ? row_mean(sum_g, n) : A(0);
  r.c2 = row_mean(sum_gx, n);
  const bool poisoned = kCentered && !(is_finite(r.c1) && is_finite(r.c2));
  r.scale = poisoned ? std::numeric_limits<A>::quiet_NaN() : rstd;
  return r;
}

// dx for g = dy gamma, with the row's coefficients broadcast to V. The multiply-adds are
// explicit (fnma, and fma for BackwardAddRMSNorm's + dextra): left to the compiler, their
// contraction differed between the CPU kernels' vector body and a row's tail.
template <typename V>
TE_MATH V norm_dx(const V& g, const V& xhat, const V& c1, const V& c2,
                                 const V& scale) {
  return scale * Ops<V>::fnma(xhat, c2, g - c1);
}

template <typename V>
TE_MATH V norm_dx_add(const V& g, const V& xhat, const V& c1, const V& c2,
                                     const V& scale, const V& dextra) {
  return Ops<V>::fma(scale, Ops<V>::fnma(xhat, c2, g - c1), dextra);
}

// L2Normalization: y = x rnorm (also the y of the backward's dot product dy . y).
template <typename V>
TE_MATH V l2norm_out(const V& x, const V& rnorm) {
  return x * rnorm;
}

// L2Normalization backward: a row whose rnorm is infinite (sum(x^2) + eps == 0: eps = 0 and a
// zero or underflowing row) is all NaN, as PyTorch's autograd of the forward gives (inf * 0),
// never +-inf.
template <typename A>
TE_MATH bool l2norm_bwd_row_is_nan(A rnorm) {
  return is_inf(rnorm);
}

// L2Normalization backward: dx = rnorm (dy - k y), k = dy . y (every intermediate O(|dy|),
// whatever the row's norm), dy - k y in one rounding. An explicit fma: left to the compiler,
// the contraction of that multiply-add depended on the surrounding code (on the CPU it differed
// between the vector body and a row's tail).
template <typename V>
TE_MATH V l2norm_dx(const V& dy, const V& y, const V& k, const V& rnorm) {
  return rnorm * Ops<V>::fnma(k, y, dy);
}

}  // namespace te_cpp::math
