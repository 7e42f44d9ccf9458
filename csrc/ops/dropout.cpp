// Checks, allocation, Meta kernels and front end of Dropout.
#include "ops/dropout.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/dropout_math.h"

namespace te_cpp {

void check_dropout_probability(const char* op, double p) {
  TE_CHECK_VALUE(p >= 0.0 && p < 1.0, op, "dropout probability p must be in [0, 1), got ", p);
}

void DropoutFwd::check(const Tensor& x, const Tensor& seed, double p) {
  check_dropout_probability(kName, p);
  check_float(kName, "input", x);
  TE_CHECK(seed.defined() && seed.scalar_type() == at::kLong, kName,
           "seed must be an int64 tensor, got ",
           seed.defined() ? c10::toString(seed.scalar_type()) : "undefined");
  TE_CHECK(seed.sym_numel() == 1, kName, "seed must have exactly one element, got shape ",
           shape_str(seed));
  check_same_device(kName, "input", x, "seed", seed);
}

std::tuple<Tensor, Tensor> DropoutFwd::allocate(const Tensor& x) {
  return {at::empty_symint(x.sym_sizes(), x.options()),
          at::empty_symint(x.sym_sizes(), x.options().dtype(at::kByte))};
}

void DropoutBwd::check(const Tensor& dy, const Tensor& mask, double p) {
  check_dropout_probability(kName, p);
  check_float(kName, "grad_output", dy);
  check_buffer(kName, "mask", mask, at::kByte, "dropout_fwd's mask");
  check_same_device(kName, "grad_output", dy, "mask", mask);
  check_same_shape(kName, "grad_output", dy, "mask", mask);
}

Tensor DropoutBwd::allocate(const Tensor& dy) {
  return at::empty_symint(dy.sym_sizes(), dy.options());
}

TE_DEFINE_STUB(dropout_fwd_stub, void(const DropoutFwdArgs&));
TE_DEFINE_STUB(dropout_bwd_stub, void(const DropoutBwdArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

std::tuple<Tensor, Tensor> dropout_fwd(const Tensor& x_in, const Tensor& seed_in, double p) {
  DropoutFwd::check(x_in, seed_in, p);
  const auto guard = device_guard(x_in);
  auto [y, mask] = DropoutFwd::allocate(x_in);
  if (y.numel() == 0) return {y, mask};
  const Tensor x = x_in.contiguous();
  const Tensor seed = seed_in.contiguous();  // read by the kernel: no host round trip
  dropout_fwd_stub(x.device().type(),
                   DropoutFwdArgs{x.scalar_type(), x.numel(), x.const_data_ptr(),
                                  seed.const_data_ptr<int64_t>(), dropout::keep_threshold(p),
                                  dropout::keep_scale(p), y.mutable_data_ptr(),
                                  mask.mutable_data_ptr<uint8_t>()});
  return {y, mask};
}

Tensor dropout_bwd(const Tensor& dy_in, const Tensor& mask_in, double p) {
  DropoutBwd::check(dy_in, mask_in, p);
  const auto guard = device_guard(dy_in);
  Tensor dx = DropoutBwd::allocate(dy_in);
  if (dx.numel() == 0) return dx;
  const Tensor dy = dy_in.contiguous();
  const Tensor mask = mask_in.contiguous();
  dropout_bwd_stub(dy.device().type(),
                   DropoutBwdArgs{dy.scalar_type(), dy.numel(), dy.const_data_ptr(),
                                  mask.const_data_ptr<uint8_t>(), dropout::keep_scale(p),
                                  dx.mutable_data_ptr()});
  return dx;
}

void register_front_ends(torch::Library& m) {
  m.impl("dropout_fwd", dropout_fwd);
  m.impl("dropout_bwd", dropout_bwd);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor> dropout_fwd_meta(const Tensor& x, const Tensor& seed, double p) {
  DropoutFwd::check(x, seed, p);
  return DropoutFwd::allocate(x);
}

Tensor dropout_bwd_meta(const Tensor& dy, const Tensor& mask, double p) {
  DropoutBwd::check(dy, mask, p);
  return DropoutBwd::allocate(dy);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("dropout_fwd", dropout_fwd_meta);
  m.impl("dropout_bwd", dropout_bwd_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
