// Checks, allocation and Meta kernels of the linear family.
#include "ops/linear.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace te_cpp {

void LinearShapes::check_fwd(const char* op, const Tensor& x, const Tensor& weight,
                             const std::optional<Tensor>& bias) {
  check_float(op, "input", x);
  check_float(op, "weight", weight);
  check_same_device(op, "input", x, "weight", weight);
  check_same_dtype(op, "input", x, "weight", weight);
  TE_CHECK(weight.dim() == 2, op, "weight must be 2-D [out_features, in_features], got shape ",
           shape_str(weight));
  check_min_dim(op, "input", x, 1);
  TE_CHECK(x.sym_size(-1) == weight.sym_size(1), op, "input's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weight (shape ", shape_str(weight),
           ")");
  if (bias.has_value()) {
    check_same_device(op, "input", x, "bias", *bias);
    check_same_dtype(op, "input", x, "bias", *bias);
    TE_CHECK(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), op, "bias shape ",
             shape_str(*bias), " must be [out_features] for weight shape ", shape_str(weight));
  }
}

Tensor LinearShapes::allocate_out(const Tensor& x, const Tensor& weight) {
  return at::empty_symint(sizes_with_last(x, weight.sym_size(0)), x.options());
}

void LinearShapes::check_dgrad(const char* op, const Tensor& dy, const Tensor& weight) {
  check_float(op, "grad_output", dy);
  check_float(op, "weight", weight);
  check_same_device(op, "grad_output", dy, "weight", weight);
  check_same_dtype(op, "grad_output", dy, "weight", weight);
  TE_CHECK(weight.dim() == 2, op, "weight must be 2-D, got shape ", shape_str(weight));
  check_min_dim(op, "grad_output", dy, 1);
  TE_CHECK(dy.sym_size(-1) == weight.sym_size(0), op, "grad_output's last dimension (shape ",
           shape_str(dy), ") must equal out_features of the weight (shape ", shape_str(weight),
           ")");
}

void LinearShapes::check_wgrad(const char* op, const Tensor& dy, const Tensor& x) {
  check_float(op, "grad_output", dy);
  check_float(op, "input", x);
  check_same_device(op, "grad_output", dy, "input", x);
  check_same_dtype(op, "grad_output", dy, "input", x);
  check_min_dim(op, "input", x, 1);
  TE_CHECK(dy.dim() == x.dim() && dy.sym_sizes().slice(0, dy.dim() - 1) ==
                                      x.sym_sizes().slice(0, x.dim() - 1),
           op, "grad_output (shape ", shape_str(dy), ") and input (shape ", shape_str(x),
           ") must share their leading dims");
}

Tensor LinearShapes::allocate_dgrad(const Tensor& dy, const Tensor& weight) {
  return at::empty_symint(sizes_with_last(dy, weight.sym_size(1)), dy.options());
}

Tensor LinearShapes::allocate_wgrad(const Tensor& dy, const Tensor& x) {
  return at::empty_symint({dy.sym_size(-1), x.sym_size(-1)}, dy.options());
}

void LinearShapes::check_extra(const char* op, const Tensor& extra, const Tensor& x,
                               const Tensor& weight) {
  check_float(op, "extra_input", extra);
  check_same_device(op, "extra_input", extra, "input", x);
  TE_CHECK(extra.sym_sizes() == c10::SymIntArrayRef(sizes_with_last(x, weight.sym_size(0))), op,
           "extra_input shape ", shape_str(extra), " must equal the output shape (input ",
           shape_str(x), ", weight ", shape_str(weight), ")");
}

void LinearShapes::check_extra_inplace(const char* op, const Tensor& extra, const Tensor& x,
                                       const Tensor& weight, const std::optional<Tensor>& bias) {
  check_extra(op, extra, x, weight);
  check_inplace_overlap(op, "extra_input", extra, "input", x, /*allow_full=*/false);
  check_inplace_overlap(op, "extra_input", extra, "weight", weight, /*allow_full=*/false);
  if (bias.has_value()) {
    check_inplace_overlap(op, "extra_input", extra, "bias", *bias, /*allow_full=*/false);
  }
}

void LinearShapes::check_dextra(const char* op, const Tensor& dextra, const Tensor& dy,
                                const Tensor& weight) {
  check_float(op, "grad_extra_output", dextra);
  check_same_device(op, "grad_extra_output", dextra, "grad_output", dy);
  TE_CHECK(dextra.sym_sizes() == c10::SymIntArrayRef(sizes_with_last(dy, weight.sym_size(1))),
           op, "grad_extra_output shape ", shape_str(dextra),
           " must equal the input-gradient shape (grad_output ", shape_str(dy), ", weight ",
           shape_str(weight), ")");
}

void LinearShapes::check_bwd(const char* op, const Tensor& dy, const Tensor& x,
                             const Tensor& weight, std::optional<at::ScalarType> bias_dtype) {
  check_dgrad(op, dy, weight);
  check_wgrad(op, dy, x);
  TE_CHECK(x.sym_size(-1) == weight.sym_size(1), op, "input's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weight (shape ", shape_str(weight),
           ")");
  if (bias_dtype.has_value()) {
    TE_CHECK(is_supported_float(*bias_dtype), op,
             "bias dtype must be float32, float64, bfloat16 or float16, got ", *bias_dtype);
  }
}

Tensor LinearShapes::allocate_dbias(const Tensor& dy, const Tensor& weight,
                                    std::optional<at::ScalarType> bias_dtype) {
  if (!bias_dtype.has_value()) return at::empty({0}, dy.options());
  return at::empty_symint({weight.sym_size(0)}, dy.options().dtype(*bias_dtype));
}

namespace {

Tensor linear_fwd_meta(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  LinearShapes::check_fwd("linear_fwd", x, weight, bias);
  return LinearShapes::allocate_out(x, weight);
}

std::tuple<Tensor, Tensor> linear_bias_act_fwd_meta(const Tensor& x, const Tensor& weight,
                                                    const std::optional<Tensor>& bias,
                                                    c10::string_view activation) {
  linear_activation("linear_bias_act_fwd", activation);
  LinearShapes::check_fwd("linear_bias_act_fwd", x, weight, bias);
  return {LinearShapes::allocate_out(x, weight), LinearShapes::allocate_out(x, weight)};
}

Tensor linear_fwd_add_meta(const Tensor& x, const Tensor& weight,
                           const std::optional<Tensor>& bias, const Tensor& extra, double) {
  LinearShapes::check_fwd("linear_fwd_add", x, weight, bias);
  LinearShapes::check_extra("linear_fwd_add", extra, x, weight);
  return at::empty_symint(extra.sym_sizes(), extra.options());
}

void linear_fwd_add_inplace_meta(const Tensor& extra, const Tensor& x, const Tensor& weight,
                                 const std::optional<Tensor>& bias, double) {
  LinearShapes::check_fwd("linear_fwd_add_inplace", x, weight, bias);
  LinearShapes::check_extra_inplace("linear_fwd_add_inplace", extra, x, weight, bias);
}

Tensor linear_dgrad_meta(const Tensor& dy, const Tensor& weight, double) {
  LinearShapes::check_dgrad("linear_dgrad", dy, weight);
  return LinearShapes::allocate_dgrad(dy, weight);
}

Tensor linear_dgrad_add_meta(const Tensor& dy, const Tensor& weight, const Tensor& dextra,
                             double) {
  LinearShapes::check_dgrad("linear_dgrad_add", dy, weight);
  LinearShapes::check_dextra("linear_dgrad_add", dextra, dy, weight);
  return at::empty_symint(dextra.sym_sizes(), dextra.options());
}

Tensor linear_wgrad_meta(const Tensor& dy, const Tensor& x, double) {
  LinearShapes::check_wgrad("linear_wgrad", dy, x);
  return LinearShapes::allocate_wgrad(dy, x);
}

std::tuple<Tensor, Tensor, Tensor> linear_bwd_meta(const Tensor& dy, const Tensor& x,
                                                   const Tensor& weight, double,
                                                   std::optional<at::ScalarType> bias_dtype) {
  LinearShapes::check_bwd("linear_bwd", dy, x, weight, bias_dtype);
  return {LinearShapes::allocate_dgrad(dy, weight), LinearShapes::allocate_wgrad(dy, x),
          LinearShapes::allocate_dbias(dy, weight, bias_dtype)};
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("linear_fwd", linear_fwd_meta);
  m.impl("linear_bias_act_fwd", linear_bias_act_fwd_meta);
  m.impl("linear_fwd_add", linear_fwd_add_meta);
  m.impl("linear_fwd_add_inplace", linear_fwd_add_inplace_meta);
  m.impl("linear_dgrad", linear_dgrad_meta);
  m.impl("linear_dgrad_add", linear_dgrad_add_meta);
  m.impl("linear_wgrad", linear_wgrad_meta);
  m.impl("linear_bwd", linear_bwd_meta);
}

}  // namespace te_cpp
