// The elementwise family: Bias, ConstantScale and the residual adds of AddExtraInput /
// MakeExtraOutput. The operator classes own the argument checks and the output allocation
// (SymInt shapes), shared by the Meta kernels and the front end (ops/elementwise.cpp); the
// backends implement the stubs below on contiguous buffers of one dtype.
#pragma once

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {

// y[r, f] = x[r, f] + bias[f]; x, bias and y in `dtype`.
struct BiasAddArgs {
  at::ScalarType dtype;
  int64_t rows, features;
  const void* x;
  const void* bias;
  void* y;
};
TE_DECLARE_STUB(bias_add_stub, void(const BiasAddArgs&));

// out[f] = sum over r of dy[r, f], accumulated in dtype's accumulation type in an order fixed
// by the shape alone (bitwise deterministic), rounded once to out_dtype. bias_bwd's kernel and
// the dbias of linear_bwd.
struct ColumnSumArgs {
  at::ScalarType dtype, out_dtype;
  int64_t rows, features;
  const void* dy;
  void* out;
};
TE_DECLARE_STUB(column_sum_stub, void(const ColumnSumArgs&));

// out[i] = scale * x[i] over n elements.
struct ScaleArgs {
  at::ScalarType dtype;
  int64_t n;
  double scale;
  const void* x;
  void* out;
};
TE_DECLARE_STUB(scale_stub, void(const ScaleArgs&));

// out[i] = a[i] + b[i] over n elements; out may be a (the in-place adds), and b may be a.
struct AddArgs {
  at::ScalarType dtype;
  int64_t n;
  const void* a;
  const void* b;
  void* out;
};
TE_DECLARE_STUB(add_stub, void(const AddArgs&));

// db = dy summed over all but its last dim, into db ([features], any supported float dtype):
// bias_bwd's front end and linear_bwd's dbias. dy: any layout, on db's device.
void bias_grad_into(const Tensor& db, const Tensor& dy);

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
