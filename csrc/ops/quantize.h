// Operator classes of the quantize family: FP8 per-tensor current and delayed scaling, and
// MXFP8 (32-element blocks with E8M0 scales). FP8 crosses the ops as plain buffers: `data`
// (uint8, the input's shape) and `scale_inv` (float32, shape (1,)) or `scale_e8m0` (uint8, one
// per block), with the format as its torch dtype (`ScalarType fp8_dtype`: float8_e4m3fn or
// float8_e5m2). Each class has one check, called by the Meta kernel and the CPU kernel alike.
// See docs/fp8.md.
#pragma once

#include "common/common.h"
#include "common/fp8.h"

#include <tuple>

namespace te_cpp {

// fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2.
void check_fp8_dtype(const char* op, at::ScalarType fp8_dtype);

// fp8_quantize(x, fp8_dtype, force_pow_2_scales, amax_epsilon) -> (data, scale_inv, amax):
// current scaling. amax is this tensor's max |x| in fp32, shape (1,).
struct Fp8Quantize {
  static constexpr const char* kName = "fp8_quantize";
  static void check(const Tensor& x, at::ScalarType fp8_dtype, double amax_epsilon);
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x);
};

// fp8_quantize_scaled(x, scale, fp8_dtype) -> (data, scale_inv, amax): the given scale
// (delayed scaling); outputs as fp8_quantize's.
struct Fp8QuantizeScaled {
  static constexpr const char* kName = "fp8_quantize_scaled";
  static void check(const Tensor& x, const Tensor& scale, at::ScalarType fp8_dtype);
};

// fp8_dequantize(data, scale_inv, fp8_dtype, dtype) -> data * scale_inv in dtype.
struct Fp8Dequantize {
  static constexpr const char* kName = "fp8_dequantize";
  static void check(const Tensor& data, const Tensor& scale_inv, at::ScalarType fp8_dtype,
                    at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

// mxfp8_quantize(x, fp8_dtype) -> (data, scale_e8m0): scale_e8m0 has x's shape with the last
// dim divided by 32.
struct Mxfp8Quantize {
  static constexpr const char* kName = "mxfp8_quantize";
  static void check(const Tensor& x, at::ScalarType fp8_dtype);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x);
};

// mxfp8_dequantize(data, scale_e8m0, fp8_dtype, dtype) -> data * 2^(e - 127) per block.
struct Mxfp8Dequantize {
  static constexpr const char* kName = "mxfp8_dequantize";
  static void check(const Tensor& data, const Tensor& scale_e8m0, at::ScalarType fp8_dtype,
                    at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

}  // namespace te_cpp
