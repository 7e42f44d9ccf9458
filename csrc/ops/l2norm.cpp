// Checks, allocation, Meta kernels and front end of L2Normalization.
#include "ops/l2norm.h"

#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

namespace te_cpp {

at::ScalarType l2norm_stat_dtype(at::ScalarType t) { return at::toOpMathType(t); }

namespace {

c10::SymDimVector leading_sizes(const Tensor& x) {
  return c10::SymDimVector(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
}

}  // namespace

void L2NormalizationFwd::check(const Tensor& x, double eps) {
  TE_CHECK_VALUE(std::isfinite(eps) && eps >= 0, kName, "eps must be finite and >= 0, got ", eps);
  check_float(kName, "input", x);
  check_min_dim(kName, "input", x, 1);
}

std::tuple<Tensor, Tensor> L2NormalizationFwd::allocate(const Tensor& x) {
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(leading_sizes(x),
                           x.options().dtype(l2norm_stat_dtype(x.scalar_type())))};
}

void L2NormalizationBwd::check(const Tensor& dy, const Tensor& x, const Tensor& rsqrt_norm) {
  check_float(kName, "grad_output", dy);
  check_float(kName, "input", x);
  check_min_dim(kName, "input", x, 1);
  check_same_device(kName, "grad_output", dy, "input", x);
  check_same_device(kName, "rsqrt_norm", rsqrt_norm, "input", x);
  check_same_shape(kName, "grad_output", dy, "input", x);
  const at::ScalarType stat = l2norm_stat_dtype(x.scalar_type());
  TE_CHECK(rsqrt_norm.scalar_type() == stat, kName, "rsqrt_norm must be ", stat,
           " for a ", x.scalar_type(), " input, got ", rsqrt_norm.scalar_type());
  TE_CHECK(rsqrt_norm.sym_sizes() == x.sym_sizes().slice(0, x.dim() - 1), kName,
           "rsqrt_norm must have the input's leading shape, got ", shape_str(rsqrt_norm),
           " for input shape ", shape_str(x));
}

Tensor L2NormalizationBwd::allocate(const Tensor& x) {
  return at::empty_symint(x.sym_sizes(), x.options());
}

TE_DEFINE_STUB(l2norm_fwd_stub, void(const L2NormFwdArgs&));
TE_DEFINE_STUB(l2norm_bwd_stub, void(const L2NormBwdArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

std::tuple<Tensor, Tensor> l2normalization_fwd(const Tensor& x_in, double eps) {
  L2NormalizationFwd::check(x_in, eps);
  const auto guard = device_guard(x_in);
  auto [y, rnorm] = L2NormalizationFwd::allocate(x_in);
  const int64_t rows = rnorm.numel();  // also right for an empty last dim (an empty sum)
  if (rows == 0) return {y, rnorm};
  const Tensor x = x_in.contiguous();
  l2norm_fwd_stub(x.device().type(),
                  L2NormFwdArgs{x.scalar_type(), rows, x.size(-1), eps, x.const_data_ptr(),
                                y.mutable_data_ptr(), rnorm.mutable_data_ptr()});
  return {y, rnorm};
}

Tensor l2normalization_bwd(const Tensor& dy_in, const Tensor& x_in, const Tensor& rn_in) {
  L2NormalizationBwd::check(dy_in, x_in, rn_in);
  const auto guard = device_guard(x_in);
  Tensor dx = L2NormalizationBwd::allocate(x_in);
  if (dx.numel() == 0) return dx;
  const Tensor x = x_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const Tensor rnorm = rn_in.contiguous();
  l2norm_bwd_stub(x.device().type(),
                  L2NormBwdArgs{x.scalar_type(), rnorm.numel(), x.size(-1),
                                dy.const_data_ptr(), x.const_data_ptr(), rnorm.const_data_ptr(),
                                dx.mutable_data_ptr()});
  return dx;
}

void register_front_ends(torch::Library& m) {
  m.impl("l2normalization_fwd", l2normalization_fwd);
  m.impl("l2normalization_bwd", l2normalization_bwd);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor> l2normalization_fwd_meta(const Tensor& x, double eps) {
  L2NormalizationFwd::check(x, eps);
  return L2NormalizationFwd::allocate(x);
}

Tensor l2normalization_bwd_meta(const Tensor& dy, const Tensor& x, const Tensor& rsqrt_norm) {
  L2NormalizationBwd::check(dy, x, rsqrt_norm);
  return L2NormalizationBwd::allocate(x);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("l2normalization_fwd", l2normalization_fwd_meta);
  m.impl("l2normalization_bwd", l2normalization_bwd_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
