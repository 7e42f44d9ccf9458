// Checks, allocation, Meta kernels and front end of Float8BlockScaling's quantize ops.
#include "ops/fp8_block.h"

#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cmath>
#include <limits>
#include <torch/library.h>

#include "ops/quantize.h"

namespace te_cpp {

namespace {

constexpr int64_t kB = fp8::kFp8BlockSize;

c10::SymInt ceil_blocks(const c10::SymInt& n) { return (n + (kB - 1)) / kB; }

// rows of the 2-D view: the product of the leading dims (1 for a 1-D tensor)
c10::SymInt sym_rows(const Tensor& t) {
  c10::SymInt rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows = rows * t.sym_size(d);
  return rows;
}

c10::SymDimVector scale_sizes(const Tensor& t, int64_t block_dim) {
  if (block_dim == 1) return sizes_with_last(t, ceil_blocks(t.sym_size(-1)));
  return {ceil_blocks(sym_rows(t)), ceil_blocks(t.sym_size(-1))};
}

}  // namespace

void check_fp8_block_dim(const char* op, int64_t block_dim) {
  TE_CHECK_VALUE(block_dim == 1 || block_dim == 2, op,
                 "block_dim must be 1 (1x128 blocks) or 2 (128x128 blocks), got ", block_dim);
}

float fp8_block_value_for_inf(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return static_cast<float>(std::numeric_limits<c10::BFloat16>::max());
  if (dtype == at::kHalf) return static_cast<float>(std::numeric_limits<c10::Half>::max());
  return fp8::kFltMax;
}

void Fp8BlockQuantize::check(const Tensor& x, at::ScalarType fp8_dtype, int64_t block_dim,
                             double amax_epsilon) {
  check_float(kName, "input", x);
  check_min_dim(kName, "input", x, 1);
  check_fp8_dtype(kName, fp8_dtype);
  check_fp8_block_dim(kName, block_dim);
  check_amax_epsilon(kName, amax_epsilon);
}

std::tuple<Tensor, Tensor> Fp8BlockQuantize::allocate(const Tensor& x, int64_t block_dim) {
  Tensor data = at::empty_symint(x.sym_sizes(), x.options().dtype(at::kByte));
  Tensor scale_inv = at::empty_symint(scale_sizes(x, block_dim), x.options().dtype(at::kFloat));
  return {data, scale_inv};
}

void Fp8BlockDequantize::check(const Tensor& data, const Tensor& scale_inv,
                               at::ScalarType fp8_dtype, int64_t block_dim,
                               at::ScalarType dtype) {
  check_buffer(kName, "data", data, at::kByte, "raw FP8 bytes");
  check_buffer(kName, "scale_inv", scale_inv, at::kFloat);
  check_min_dim(kName, "data", data, 1);
  check_same_device(kName, "data", data, "scale_inv", scale_inv);
  check_fp8_dtype(kName, fp8_dtype);
  check_fp8_block_dim(kName, block_dim);
  const auto expected = scale_sizes(data, block_dim);
  TE_CHECK(scale_inv.sym_sizes() == c10::SymIntArrayRef(expected), kName, "scale_inv must have "
           "shape ", c10::SymIntArrayRef(expected), " for data of shape ", shape_str(data),
           " and block_dim ", block_dim, ", got ", shape_str(scale_inv));
  check_float_dtype(kName, "dtype", dtype);
}

Tensor Fp8BlockDequantize::allocate(const Tensor& data, at::ScalarType dtype) {
  return at::empty_symint(data.sym_sizes(), data.options().dtype(dtype));
}

TE_DEFINE_STUB(fp8_block_quantize_stub, void(const Fp8BlockQuantizeArgs&));
TE_DEFINE_STUB(fp8_block_dequantize_stub, void(const Fp8BlockDequantizeArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

std::tuple<Tensor, Tensor> fp8_block_quantize(const Tensor& x_in, at::ScalarType fp8_dtype,
                                              int64_t block_dim, bool force_pow_2_scales,
                                              double amax_epsilon) {
  Fp8BlockQuantize::check(x_in, fp8_dtype, block_dim, amax_epsilon);
  const auto guard = device_guard(x_in);
  auto [data, scale_inv] = Fp8BlockQuantize::allocate(x_in, block_dim);
  if (data.numel() == 0) return {data, scale_inv};
  // float64 is rounded to float32 first: the algorithm is defined on x in fp32
  const Tensor x = (x_in.scalar_type() == at::kDouble ? x_in.to(at::kFloat) : x_in).contiguous();
  const auto [rows, cols] = rows_features(x);
  fp8_block_quantize_stub(
      x.device().type(),
      Fp8BlockQuantizeArgs{x.scalar_type(), fp8_dtype, rows, cols, static_cast<int>(block_dim),
                           force_pow_2_scales, static_cast<float>(amax_epsilon),
                           fp8_block_value_for_inf(x.scalar_type()), x.const_data_ptr(),
                           data.mutable_data_ptr<uint8_t>(),
                           scale_inv.mutable_data_ptr<float>()});
  return {data, scale_inv};
}

Tensor fp8_block_dequantize(const Tensor& data_in, const Tensor& scale_in,
                            at::ScalarType fp8_dtype, int64_t block_dim, at::ScalarType dtype) {
  Fp8BlockDequantize::check(data_in, scale_in, fp8_dtype, block_dim, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = Fp8BlockDequantize::allocate(data_in, dtype);
  if (out.numel() == 0) return out;
  const Tensor data = data_in.contiguous();
  const Tensor scale_inv = scale_in.contiguous();
  const auto [rows, cols] = rows_features(data);
  fp8_block_dequantize_stub(
      data.device().type(),
      Fp8BlockDequantizeArgs{fp8_dtype, dtype, rows, cols, static_cast<int>(block_dim),
                             data.const_data_ptr<uint8_t>(), scale_inv.const_data_ptr<float>(),
                             out.mutable_data_ptr()});
  return out;
}

void register_front_ends(torch::Library& m) {
  m.impl("fp8_block_quantize", fp8_block_quantize);
  m.impl("fp8_block_dequantize", fp8_block_dequantize);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor> fp8_block_quantize_meta(const Tensor& x, at::ScalarType fp8_dtype,
                                                   int64_t block_dim, bool, double amax_epsilon) {
  Fp8BlockQuantize::check(x, fp8_dtype, block_dim, amax_epsilon);
  return Fp8BlockQuantize::allocate(x, block_dim);
}

Tensor fp8_block_dequantize_meta(const Tensor& data, const Tensor& scale_inv,
                                 at::ScalarType fp8_dtype, int64_t block_dim,
                                 at::ScalarType dtype) {
  Fp8BlockDequantize::check(data, scale_inv, fp8_dtype, block_dim, dtype);
  return Fp8BlockDequantize::allocate(data, dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("fp8_block_quantize", fp8_block_quantize_meta);
  m.impl("fp8_block_dequantize", fp8_block_dequantize_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
