// Checks, allocation and Meta kernels of L2Normalization.
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

namespace {

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

}  // namespace te_cpp
