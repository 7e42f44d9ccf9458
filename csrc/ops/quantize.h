// Operator classes of the quantize family: FP8 per-tensor current and delayed scaling, and
// MXFP8 (32-element blocks with E8M0 scales). FP8 crosses the ops as plain buffers: `data`
// (uint8, the input's shape) and `scale_inv` (float32, shape (1,)) or `scale_e8m0` (uint8, one
// per block), with the format as an int (0 = E4M3, 1 = E5M2). See docs/fp8.md.
#pragma once

#include "common/common.h"
#include "common/fp8.h"

#include <tuple>

namespace te_cpp {

void check_fp8_format(const char* op, int64_t fp8_format);

// fp8_quantize(x, fp8_format, force_pow_2_scales, amax_epsilon) -> (data, scale_inv, amax):
// current scaling; fp8_quantize_scaled(x, scale, fp8_format) -> (data, scale_inv, amax): the
// given scale (delayed scaling). amax is this tensor's max |x| in fp32, shape (1,).
struct Fp8Quantize {
  static void check(const char* op, const Tensor& x, int64_t fp8_format);
  static void check_scale(const char* op, const Tensor& x, const Tensor& scale);
  static void check_epsilon(const char* op, double amax_epsilon);
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x);
};

// fp8_dequantize(data, scale_inv, fp8_format, dtype) -> data * scale_inv in dtype.
struct Fp8Dequantize {
  static constexpr const char* kName = "fp8_dequantize";
  static void check(const Tensor& data, const Tensor& scale_inv, int64_t fp8_format,
                    at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

// mxfp8_quantize(x, fp8_format) -> (data, scale_e8m0): scale_e8m0 has x's shape with the last
// dim divided by 32.
struct Mxfp8Quantize {
  static constexpr const char* kName = "mxfp8_quantize";
  static void check(const Tensor& x, int64_t fp8_format);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x);
};

// mxfp8_dequantize(data, scale_e8m0, fp8_format, dtype) -> data * 2^(e - 127) per block.
struct Mxfp8Dequantize {
  static constexpr const char* kName = "mxfp8_dequantize";
  static void check(const Tensor& data, const Tensor& scale_e8m0, int64_t fp8_format,
                    at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

}  // namespace te_cpp
