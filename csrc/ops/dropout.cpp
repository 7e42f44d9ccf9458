// Checks, allocation and Meta kernels of Dropout.
#include "ops/dropout.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

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
  TE_CHECK(mask.scalar_type() == at::kByte, kName, "mask must be uint8 (dropout_fwd's mask), got ",
           mask.scalar_type());
  check_same_device(kName, "grad_output", dy, "mask", mask);
  check_same_shape(kName, "grad_output", dy, "mask", mask);
}

Tensor DropoutBwd::allocate(const Tensor& dy) {
  return at::empty_symint(dy.sym_sizes(), dy.options());
}

namespace {

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

}  // namespace te_cpp
