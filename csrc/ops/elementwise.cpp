// Checks, allocation and Meta kernels of the elementwise family.
#include "ops/elementwise.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

namespace te_cpp {

at::ScalarType BiasFwd::out_dtype(const Tensor& x, const Tensor& bias) {
  return c10::promoteTypes(x.scalar_type(), bias.scalar_type());
}

void BiasFwd::check(const Tensor& x, const Tensor& bias) {
  check_float(kName, "input", x);
  check_float(kName, "bias", bias);
  check_same_device(kName, "input", x, "bias", bias);
  TE_CHECK(bias.dim() == 1, kName, "bias must be 1-D, got shape ", shape_str(bias));
  check_min_dim(kName, "input", x, 1);
  TE_CHECK(x.sym_size(-1) == bias.sym_size(0), kName, "input's last dimension (shape ",
           shape_str(x), ") must equal the bias size ", bias.sym_size(0));
}

Tensor BiasFwd::allocate(const Tensor& x, const Tensor& bias) {
  return at::empty_symint(x.sym_sizes(), x.options().dtype(out_dtype(x, bias)));
}

void BiasBwd::check(const Tensor& dy, at::ScalarType bias_dtype) {
  check_float(kName, "grad_output", dy);
  check_min_dim(kName, "grad_output", dy, 1);
  TE_CHECK(is_supported_float(bias_dtype), kName,
           "bias dtype must be float32, float64, bfloat16 or float16, got ", bias_dtype);
}

Tensor BiasBwd::allocate(const Tensor& dy, at::ScalarType bias_dtype) {
  return at::empty_symint({dy.sym_size(-1)}, dy.options().dtype(bias_dtype));
}

void ConstantScale::check(const char* op, const Tensor& x) { check_float(op, "input", x); }

Tensor ConstantScale::allocate(const Tensor& x) {
  return at::empty_symint(x.sym_sizes(), x.options());
}

void ResidualAdd::check(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b) {
  check_float(op, name_a, a);
  check_float(op, name_b, b);
  check_same_device(op, name_a, a, name_b, b);
  check_same_shape(op, name_a, a, name_b, b);
}

void ResidualAdd::check_inplace(const char* op, const char* name_buf, const Tensor& buffer,
                                const char* name_other, const Tensor& other) {
  check(op, name_buf, buffer, name_other, other);
  check_inplace_overlap(op, name_buf, buffer, name_other, other, /*allow_full=*/true);
}

Tensor ResidualAdd::allocate(const Tensor& a, const Tensor& b) {
  return at::empty_symint(a.sym_sizes(),
                          a.options().dtype(c10::promoteTypes(a.scalar_type(), b.scalar_type())));
}

namespace {

Tensor bias_fwd_meta(const Tensor& x, const Tensor& bias) {
  BiasFwd::check(x, bias);
  return BiasFwd::allocate(x, bias);
}

Tensor bias_bwd_meta(const Tensor& dy, at::ScalarType bias_dtype) {
  BiasBwd::check(dy, bias_dtype);
  return BiasBwd::allocate(dy, bias_dtype);
}

Tensor constant_scale_fwd_meta(const Tensor& x, double) {
  ConstantScale::check("constant_scale_fwd", x);
  return ConstantScale::allocate(x);
}

Tensor constant_scale_bwd_meta(const Tensor& dy, double) {
  ConstantScale::check("constant_scale_bwd", dy);
  return ConstantScale::allocate(dy);
}

Tensor add_extra_input_fwd_meta(const Tensor& x, const Tensor& extra) {
  ResidualAdd::check("add_extra_input_fwd", "input", x, "extra_input", extra);
  return ResidualAdd::allocate(x, extra);
}

void add_extra_input_fwd_inplace_meta(const Tensor& extra, const Tensor& x) {
  ResidualAdd::check_inplace("add_extra_input_fwd_inplace", "extra_input", extra, "input", x);
}

Tensor make_extra_output_bwd_meta(const Tensor& dy, const Tensor& dextra) {
  ResidualAdd::check("make_extra_output_bwd", "grad_output", dy, "grad_extra_output", dextra);
  return ResidualAdd::allocate(dy, dextra);
}

void make_extra_output_bwd_inplace_meta(const Tensor& dextra, const Tensor& dy) {
  ResidualAdd::check_inplace("make_extra_output_bwd_inplace", "grad_extra_output", dextra,
                             "grad_output", dy);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("bias_fwd", bias_fwd_meta);
  m.impl("bias_bwd", bias_bwd_meta);
  m.impl("constant_scale_fwd", constant_scale_fwd_meta);
  m.impl("constant_scale_bwd", constant_scale_bwd_meta);
  m.impl("add_extra_input_fwd", add_extra_input_fwd_meta);
  m.impl("add_extra_input_fwd_inplace", add_extra_input_fwd_inplace_meta);
  m.impl("make_extra_output_bwd", make_extra_output_bwd_meta);
  m.impl("make_extra_output_bwd_inplace", make_extra_output_bwd_inplace_meta);
}

}  // namespace te_cpp
