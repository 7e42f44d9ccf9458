// The elementwise family's checks, allocation, Meta kernels and front end.
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

TE_DEFINE_STUB(bias_add_stub, void(const BiasAddArgs&));
TE_DEFINE_STUB(column_sum_stub, void(const ColumnSumArgs&));
TE_DEFINE_STUB(scale_stub, void(const ScaleArgs&));
TE_DEFINE_STUB(add_stub, void(const AddArgs&));

void bias_grad_into(const Tensor& db, const Tensor& dy_in) {
  const Tensor dy = dy_in.contiguous();
  const auto [rows, features] = rows_features(dy);
  if (features == 0) return;
  column_sum_stub(dy.device().type(),
                  ColumnSumArgs{dy.scalar_type(), db.scalar_type(), rows, features,
                                dy.const_data_ptr(), db.mutable_data_ptr()});
}

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

Tensor bias_fwd(const Tensor& x_in, const Tensor& bias_in) {
  BiasFwd::check(x_in, bias_in);
  const auto guard = device_guard(x_in);
  Tensor out = BiasFwd::allocate(x_in, bias_in);
  if (out.numel() == 0) return out;
  const Tensor x = x_in.to(out.scalar_type()).contiguous();
  const Tensor bias = bias_in.to(out.scalar_type()).contiguous();
  const auto [rows, features] = rows_features(x);
  bias_add_stub(x.device().type(), BiasAddArgs{out.scalar_type(), rows, features,
                                               x.const_data_ptr(), bias.const_data_ptr(),
                                               out.mutable_data_ptr()});
  return out;
}

Tensor bias_bwd(const Tensor& dy, at::ScalarType bias_dtype) {
  BiasBwd::check(dy, bias_dtype);
  const auto guard = device_guard(dy);
  Tensor db = BiasBwd::allocate(dy, bias_dtype);
  bias_grad_into(db, dy);
  return db;
}

Tensor constant_scale(const char* op, const Tensor& x_in, double scale) {
  ConstantScale::check(op, x_in);
  const auto guard = device_guard(x_in);
  Tensor out = ConstantScale::allocate(x_in);
  if (out.numel() == 0) return out;
  const Tensor x = x_in.contiguous();
  scale_stub(x.device().type(), ScaleArgs{x.scalar_type(), x.numel(), scale, x.const_data_ptr(),
                                          out.mutable_data_ptr()});
  return out;
}

Tensor constant_scale_fwd(const Tensor& x, double scale) {
  return constant_scale("constant_scale_fwd", x, scale);
}

Tensor constant_scale_bwd(const Tensor& dy, double scale) {
  return constant_scale("constant_scale_bwd", dy, scale);
}

// out = a + b, all three contiguous and of one dtype (out may be a).
void add_into(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  add_stub(out.device().type(), AddArgs{out.scalar_type(), out.numel(), a.const_data_ptr(),
                                        b.const_data_ptr(), out.mutable_data_ptr()});
}

Tensor residual_add(const char* op, const char* na, const Tensor& a, const char* nb,
                    const Tensor& b) {
  ResidualAdd::check(op, na, a, nb, b);
  const auto guard = device_guard(a);
  Tensor out = ResidualAdd::allocate(a, b);
  add_into(a.to(out.scalar_type()).contiguous(), b.to(out.scalar_type()).contiguous(), out);
  return out;
}

// buffer += other, in the buffer's dtype (other is rounded to it first); a non-contiguous
// buffer is updated through a contiguous copy.
void residual_add_inplace(const char* op, const char* nbuf, const Tensor& buffer,
                          const char* nother, const Tensor& other) {
  ResidualAdd::check_inplace(op, nbuf, buffer, nother, other);
  const auto guard = device_guard(buffer);
  const Tensor o = other.to(buffer.scalar_type()).contiguous();
  if (buffer.is_contiguous()) {
    add_into(buffer, o, buffer);
  } else {
    Tensor tmp = buffer.contiguous();
    add_into(tmp, o, tmp);
    const_cast<Tensor&>(buffer).copy_(tmp);
  }
}

Tensor add_extra_input_fwd(const Tensor& x, const Tensor& extra) {
  return residual_add("add_extra_input_fwd", "input", x, "extra_input", extra);
}

void add_extra_input_fwd_inplace(const Tensor& extra, const Tensor& x) {
  residual_add_inplace("add_extra_input_fwd_inplace", "extra_input", extra, "input", x);
}

Tensor make_extra_output_bwd(const Tensor& dy, const Tensor& dextra) {
  return residual_add("make_extra_output_bwd", "grad_output", dy, "grad_extra_output", dextra);
}

void make_extra_output_bwd_inplace(const Tensor& dextra, const Tensor& dy) {
  residual_add_inplace("make_extra_output_bwd_inplace", "grad_extra_output", dextra,
                       "grad_output", dy);
}

void register_front_ends(torch::Library& m) {
  m.impl("bias_fwd", bias_fwd);
  m.impl("bias_bwd", bias_bwd);
  m.impl("constant_scale_fwd", constant_scale_fwd);
  m.impl("constant_scale_bwd", constant_scale_bwd);
  m.impl("add_extra_input_fwd", add_extra_input_fwd);
  m.impl("add_extra_input_fwd_inplace", add_extra_input_fwd_inplace);
  m.impl("make_extra_output_bwd", make_extra_output_bwd);
  m.impl("make_extra_output_bwd_inplace", make_extra_output_bwd_inplace);
}

// ---- Meta kernels ----

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

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
