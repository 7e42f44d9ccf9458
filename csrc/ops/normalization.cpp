// Checks, allocation, Meta kernels and front end of the normalisation family.
#include "ops/normalization.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

namespace te_cpp {

void NormShapes::check(const char* op, const Tensor& x, const Tensor& weight,
                       const Tensor* bias) {
  check_float(op, "input", x);
  check_float(op, "weight", weight);
  check_same_device(op, "input", x, "weight", weight);
  check_same_dtype(op, "input", x, "weight", weight);
  TE_CHECK(weight.dim() >= 1, op, "weight must have at least 1 dimension, got shape ",
           shape_str(weight));
  TE_CHECK(x.dim() >= weight.dim() &&
               x.sym_sizes().slice(x.dim() - weight.dim()) == weight.sym_sizes(),
           op, "the trailing dims of the input (shape ", shape_str(x),
           ") must equal the normalized shape ", shape_str(weight));
  if (bias != nullptr) {
    check_same_device(op, "input", x, "bias", *bias);
    check_same_dtype(op, "input", x, "bias", *bias);
    check_same_shape(op, "weight", weight, "bias", *bias);
  }
}

c10::SymDimVector NormShapes::stat_shape(const Tensor& x, const Tensor& weight) {
  const auto lead = x.sym_sizes().slice(0, x.dim() - weight.dim());
  return c10::SymDimVector(lead.begin(), lead.end());
}

at::ScalarType NormShapes::stat_dtype(const Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

Tensor NormShapes::allocate_stat(const Tensor& x, const Tensor& weight) {
  return at::empty_symint(stat_shape(x, weight), x.options().dtype(stat_dtype(x)));
}

void NormShapes::check_stat(const char* op, const char* name, const Tensor& stat,
                            const Tensor& x, const Tensor& weight) {
  check_same_device(op, "input", x, name, stat);
  TE_CHECK(stat.scalar_type() == stat_dtype(x), op, name, " must be ", stat_dtype(x),
           " for a ", x.scalar_type(), " input, got ", stat.scalar_type());
  const auto expected = stat_shape(x, weight);
  TE_CHECK(stat.sym_sizes() == c10::SymIntArrayRef(expected), op, name, " shape ",
           shape_str(stat), " does not match the input's leading dims (input ", shape_str(x),
           ", normalized shape ", shape_str(weight), ")");
}

void NormShapes::check_eps(const char* op, double eps) {
  TE_CHECK_VALUE(std::isfinite(eps) && eps >= 0, op, "eps must be finite and >= 0, got ", eps);
}

std::tuple<Tensor, Tensor, Tensor> LayerNormFwd::allocate(const Tensor& x, const Tensor& weight) {
  return {at::empty_symint(x.sym_sizes(), x.options()), NormShapes::allocate_stat(x, weight),
          NormShapes::allocate_stat(x, weight)};
}

void LayerNormBwd::check(const Tensor& dy, const Tensor& x, const Tensor& mean,
                         const Tensor& rstd, const Tensor& weight) {
  NormShapes::check(kName, x, weight, nullptr);
  check_float(kName, "grad_output", dy);
  check_same_device(kName, "grad_output", dy, "input", x);
  check_same_shape(kName, "grad_output", dy, "input", x);
  NormShapes::check_stat(kName, "mean", mean, x, weight);
  NormShapes::check_stat(kName, "rstd", rstd, x, weight);
}

std::tuple<Tensor, Tensor, Tensor> LayerNormBwd::allocate(const Tensor& x, const Tensor& weight) {
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(weight.sym_sizes(), weight.options()),
          at::empty_symint(weight.sym_sizes(), weight.options())};
}

std::tuple<Tensor, Tensor> RMSNormFwd::allocate(const Tensor& x, const Tensor& weight) {
  return {at::empty_symint(x.sym_sizes(), x.options()), NormShapes::allocate_stat(x, weight)};
}

void RMSNormBwd::check(const char* op, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                       const Tensor& weight, const Tensor* dextra) {
  NormShapes::check(op, x, weight, nullptr);
  check_float(op, "grad_output", dy);
  check_same_device(op, "grad_output", dy, "input", x);
  check_same_shape(op, "grad_output", dy, "input", x);
  NormShapes::check_stat(op, "rstd", rstd, x, weight);
  if (dextra != nullptr) {
    check_float(op, "grad_extra_output", *dextra);
    check_same_device(op, "grad_extra_output", *dextra, "input", x);
    check_same_shape(op, "grad_extra_output", *dextra, "input", x);
  }
}

std::tuple<Tensor, Tensor> RMSNormBwd::allocate(const Tensor& x, const Tensor& weight) {
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(weight.sym_sizes(), weight.options())};
}

TE_DEFINE_STUB(norm_fwd_stub, void(const NormFwdArgs&));
TE_DEFINE_STUB(norm_bwd_stub, void(const NormBwdArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

// Number of rows: the product of x's leading dims (the statistics' numel), also when the
// normalized shape is empty.
int64_t norm_rows(const Tensor& stat) { return stat.numel(); }

std::tuple<Tensor, Tensor, Tensor> layernorm_fwd(const Tensor& x_in, const Tensor& weight_in,
                                                 const Tensor& bias_in, double eps,
                                                 bool zero_centered_gamma) {
  NormShapes::check(LayerNormFwd::kName, x_in, weight_in, &bias_in);
  NormShapes::check_eps(LayerNormFwd::kName, eps);
  const auto guard = device_guard(x_in);
  auto [y, mean, rstd] = LayerNormFwd::allocate(x_in, weight_in);
  const int64_t rows = norm_rows(mean);
  if (rows == 0) return {y, mean, rstd};
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), bias = bias_in.contiguous();
  norm_fwd_stub(x.device().type(),
                NormFwdArgs{NormKind::kLayerNorm, x.scalar_type(), rows, weight.numel(), eps,
                            zero_centered_gamma, x.const_data_ptr(), weight.const_data_ptr(),
                            bias.const_data_ptr(), y.mutable_data_ptr(), mean.mutable_data_ptr(),
                            rstd.mutable_data_ptr()});
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor> rmsnorm_fwd(const Tensor& x_in, const Tensor& weight_in, double eps,
                                       bool zero_centered_gamma) {
  NormShapes::check(RMSNormFwd::kName, x_in, weight_in, nullptr);
  NormShapes::check_eps(RMSNormFwd::kName, eps);
  const auto guard = device_guard(x_in);
  auto [y, rstd] = RMSNormFwd::allocate(x_in, weight_in);
  const int64_t rows = norm_rows(rstd);
  if (rows == 0) return {y, rstd};
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  norm_fwd_stub(x.device().type(),
                NormFwdArgs{NormKind::kRMSNorm, x.scalar_type(), rows, weight.numel(), eps,
                            zero_centered_gamma, x.const_data_ptr(), weight.const_data_ptr(),
                            nullptr, y.mutable_data_ptr(), nullptr, rstd.mutable_data_ptr()});
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layernorm_bwd(const Tensor& dy_in, const Tensor& x_in,
                                                 const Tensor& mean_in, const Tensor& rstd_in,
                                                 const Tensor& weight_in,
                                                 bool zero_centered_gamma) {
  LayerNormBwd::check(dy_in, x_in, mean_in, rstd_in, weight_in);
  const auto guard = device_guard(x_in);
  auto [dx, dweight, dbias] = LayerNormBwd::allocate(x_in, weight_in);
  const int64_t rows = norm_rows(mean_in), features = weight_in.numel();
  if (rows == 0) {  // no rows: the parameter gradients are sums of nothing
    dweight.zero_();
    dbias.zero_();
  }
  if (rows == 0 || features == 0) return {dx, dweight, dbias};
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  norm_bwd_stub(x.device().type(),
                NormBwdArgs{NormKind::kLayerNorm, x.scalar_type(), rows, features,
                            zero_centered_gamma, dy.const_data_ptr(), x.const_data_ptr(),
                            mean.const_data_ptr(), rstd.const_data_ptr(),
                            weight.const_data_ptr(), nullptr, dx.mutable_data_ptr(),
                            dweight.mutable_data_ptr(), dbias.mutable_data_ptr()});
  return {dx, dweight, dbias};
}

// rmsnorm_bwd, and rmsnorm_bwd_add when dextra is given.
std::tuple<Tensor, Tensor> rmsnorm_bwd_impl(const char* op, const Tensor& dy_in,
                                            const Tensor& x_in, const Tensor& rstd_in,
                                            const Tensor& weight_in, bool zero_centered_gamma,
                                            const Tensor* dextra_in) {
  RMSNormBwd::check(op, dy_in, x_in, rstd_in, weight_in, dextra_in);
  const auto guard = device_guard(x_in);
  auto [dx, dweight] = RMSNormBwd::allocate(x_in, weight_in);
  const int64_t rows = norm_rows(rstd_in), features = weight_in.numel();
  if (rows == 0) dweight.zero_();  // no rows: a sum of nothing
  if (rows == 0 || features == 0) return {dx, dweight};
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const Tensor rstd = rstd_in.contiguous();
  const Tensor dextra = dextra_in ? dextra_in->to(x.scalar_type()).contiguous() : Tensor();
  norm_bwd_stub(x.device().type(),
                NormBwdArgs{NormKind::kRMSNorm, x.scalar_type(), rows, features,
                            zero_centered_gamma, dy.const_data_ptr(), x.const_data_ptr(),
                            nullptr, rstd.const_data_ptr(), weight.const_data_ptr(),
                            dextra.defined() ? dextra.const_data_ptr() : nullptr,
                            dx.mutable_data_ptr(), dweight.mutable_data_ptr(), nullptr});
  return {dx, dweight};
}

std::tuple<Tensor, Tensor> rmsnorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                       const Tensor& weight, bool zero_centered_gamma) {
  return rmsnorm_bwd_impl("rmsnorm_bwd", dy, x, rstd, weight, zero_centered_gamma, nullptr);
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_add(const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                           const Tensor& weight, bool zero_centered_gamma,
                                           const Tensor& dextra) {
  return rmsnorm_bwd_impl("rmsnorm_bwd_add", dy, x, rstd, weight, zero_centered_gamma, &dextra);
}

void register_front_ends(torch::Library& m) {
  m.impl("layernorm_fwd", layernorm_fwd);
  m.impl("layernorm_bwd", layernorm_bwd);
  m.impl("rmsnorm_fwd", rmsnorm_fwd);
  m.impl("rmsnorm_bwd", rmsnorm_bwd);
  m.impl("rmsnorm_bwd_add", rmsnorm_bwd_add);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor, Tensor> layernorm_fwd_meta(const Tensor& x, const Tensor& weight,
                                                      const Tensor& bias, double eps, bool) {
  NormShapes::check(LayerNormFwd::kName, x, weight, &bias);
  NormShapes::check_eps(LayerNormFwd::kName, eps);
  return LayerNormFwd::allocate(x, weight);
}

std::tuple<Tensor, Tensor, Tensor> layernorm_bwd_meta(const Tensor& dy, const Tensor& x,
                                                      const Tensor& mean, const Tensor& rstd,
                                                      const Tensor& weight, bool) {
  LayerNormBwd::check(dy, x, mean, rstd, weight);
  return LayerNormBwd::allocate(x, weight);
}

std::tuple<Tensor, Tensor> rmsnorm_fwd_meta(const Tensor& x, const Tensor& weight, double eps,
                                            bool) {
  NormShapes::check(RMSNormFwd::kName, x, weight, nullptr);
  NormShapes::check_eps(RMSNormFwd::kName, eps);
  return RMSNormFwd::allocate(x, weight);
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_meta(const Tensor& dy, const Tensor& x,
                                            const Tensor& rstd, const Tensor& weight, bool) {
  RMSNormBwd::check("rmsnorm_bwd", dy, x, rstd, weight, nullptr);
  return RMSNormBwd::allocate(x, weight);
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_add_meta(const Tensor& dy, const Tensor& x,
                                                const Tensor& rstd, const Tensor& weight, bool,
                                                const Tensor& dextra) {
  RMSNormBwd::check("rmsnorm_bwd_add", dy, x, rstd, weight, &dextra);
  return RMSNormBwd::allocate(x, weight);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("layernorm_fwd", layernorm_fwd_meta);
  m.impl("layernorm_bwd", layernorm_bwd_meta);
  m.impl("rmsnorm_fwd", rmsnorm_fwd_meta);
  m.impl("rmsnorm_bwd", rmsnorm_bwd_meta);
  m.impl("rmsnorm_bwd_add", rmsnorm_bwd_add_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
