// Operator classes of L2Normalization: y = x * rsqrt(sum(x^2 over the last dim) + eps).
//
// The forward returns (y, rsqrt_norm): rsqrt_norm holds one value per row (shape
// x.shape[:-1]) in the accumulation type (fp32 for fp32/bf16/fp16 inputs, fp64 for fp64). The
// backward takes the forward's input and rsqrt_norm:
//   dx = r * (dy - (dy . y) * y),   y = x * r,   r = rsqrt_norm of the row
// (algebraically r dy - r^3 (dy . x) x, but without r^3, which overflows fp32 for rows of
// norm below ~1e-13 and loses accuracy before that).
#pragma once

#include <tuple>

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {

// The backends' stubs, on contiguous buffers (x, dy, y, dx in dtype; rsqrt_norm in its
// accumulation type), rows x features with rows >= 1. Forward: features may be 0 (an empty
// sum: rsqrt_norm = 1 / sqrt(eps)).
struct L2NormFwdArgs {
  at::ScalarType dtype;
  int64_t rows, features;
  double eps;
  const void* x;
  void* y;
  void* rsqrt_norm;
};
TE_DECLARE_STUB(l2norm_fwd_stub, void(const L2NormFwdArgs&));

// Backward: features >= 1.
struct L2NormBwdArgs {
  at::ScalarType dtype;
  int64_t rows, features;
  const void* dy;
  const void* x;
  const void* rsqrt_norm;
  void* dx;
};
TE_DECLARE_STUB(l2norm_bwd_stub, void(const L2NormBwdArgs&));

// The dtype of rsqrt_norm for an input of dtype t.
at::ScalarType l2norm_stat_dtype(at::ScalarType t);

struct L2NormalizationFwd {
  static constexpr const char* kName = "l2normalization_fwd";
  static void check(const Tensor& x, double eps);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x);  // (y, rsqrt_norm)
};

struct L2NormalizationBwd {
  static constexpr const char* kName = "l2normalization_bwd";
  static void check(const Tensor& dy, const Tensor& x, const Tensor& rsqrt_norm);
  static Tensor allocate(const Tensor& x);  // dx
};

}  // namespace te_cpp
