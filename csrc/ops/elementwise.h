// Operator classes of the elementwise family: Bias, ConstantScale and the residual adds of
// AddExtraInput / MakeExtraOutput. Each class owns the argument checks and the output
// allocation (SymInt shapes); the Meta kernels and the device kernels both go through them, so
// fake and real agree by construction.
#pragma once

#include "common/common.h"

namespace te_cpp {

// bias_fwd(x, bias) -> y = x + bias (bias broadcast over the leading dims).
struct BiasFwd {
  static constexpr const char* kName = "bias_fwd";
  static at::ScalarType out_dtype(const Tensor& x, const Tensor& bias);
  static void check(const Tensor& x, const Tensor& bias);
  static Tensor allocate(const Tensor& x, const Tensor& bias);
};

// bias_bwd(dy, bias_dtype) -> dbias = dy summed over all but the last dim, in bias_dtype.
struct BiasBwd {
  static constexpr const char* kName = "bias_bwd";
  static void check(const Tensor& dy, at::ScalarType bias_dtype);
  static Tensor allocate(const Tensor& dy, at::ScalarType bias_dtype);
};

// constant_scale_fwd(x, scale) -> scale * x; constant_scale_bwd(dy, scale) -> scale * dy.
struct ConstantScale {
  static void check(const char* op, const Tensor& x);
  static Tensor allocate(const Tensor& x);
};

// Residual add: functional (`a + b`, fresh output in the promoted dtype) and in place
// (`buffer += other`, in the buffer's dtype). Shapes must match exactly. In place, `other` may be
// `buffer` itself but not partially overlap it, and `buffer` must not be an expanded view.
struct ResidualAdd {
  static void check(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                    const Tensor& b);
  static void check_inplace(const char* op, const char* name_buf, const Tensor& buffer,
                            const char* name_other, const Tensor& other);
  static Tensor allocate(const Tensor& a, const Tensor& b);
};

}  // namespace te_cpp
