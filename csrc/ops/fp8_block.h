// Operator classes of Float8BlockScaling (TransformerEngine's Float8BlockQuantizer): FP8 with
// one fp32 scale per 1x128 block (128 consecutive elements of a row of the 2-D view [rows,
// last dim]) or per 128x128 tile of that view. Blocks at the right and bottom edges are
// partial (they hold what is left; TransformerEngine zero-pads them, which leaves the amax
// unchanged). The scale buffers are unpadded (TransformerEngine pads and, for 1x128, transposes
// them for cuBLAS):
//   block_dim 1: scale_inv has x's shape with the last dim replaced by ceil(last / 128);
//   block_dim 2: scale_inv is [ceil(rows / 128), ceil(last / 128)].
// The columnwise copy TransformerEngine keeps (blocks down the columns) is the quantization of
// the 2-D view's transpose (the Python quantizer calls the same op on it). See
// docs/quantization.md.
#pragma once

#include "common/backend.h"
#include "common/common.h"
#include "common/fp8.h"

#include <tuple>

namespace te_cpp {

// Block quantization of the 2-D view [rows, cols] of x (contiguous; dtype float32, bfloat16
// or float16; the front end rounds float64 to float32). Per block (1 x 128, or 128 x 128 with
// block_dim 2): amax = fp8::block_amax_step over its elements (NaN skipped, from 0);
// scale = fp8::compute_scale(amax, max_norm(fp8_dtype), force_pow_2_scales, amax_epsilon,
// value_for_inf); scale_inv[block] = fp8::scale_inv(scale); data = cast_to_fp8(x * scale).
// scale_inv is row major: [rows, ceil(cols / 128)] or [ceil(rows / 128), ceil(cols / 128)].
struct Fp8BlockQuantizeArgs {
  at::ScalarType dtype, fp8_dtype;
  int64_t rows, cols;
  int block_dim;
  bool force_pow_2_scales;
  float amax_epsilon, value_for_inf;
  const void* x;
  uint8_t* data;
  float* scale_inv;
};
TE_DECLARE_STUB(fp8_block_quantize_stub, void(const Fp8BlockQuantizeArgs&));

// out[r, c] = out_dtype(fp8_to_float(data[r, c]) * scale_inv[block of (r, c)]), the product in
// fp32, over the 2-D view [rows, cols] (rows * cols > 0), scale_inv laid out as above.
struct Fp8BlockDequantizeArgs {
  at::ScalarType fp8_dtype, out_dtype;
  int64_t rows, cols;
  int block_dim;
  const uint8_t* data;
  const float* scale_inv;
  void* out;
};
TE_DECLARE_STUB(fp8_block_dequantize_stub, void(const Fp8BlockDequantizeArgs&));

// The value a +inf scale becomes for an input of `dtype` (Fp8BlockQuantizeArgs::value_for_inf):
// the dtype's largest finite value (TransformerEngine's compute_scale_from_types); float64
// inputs are quantized as float32.
float fp8_block_value_for_inf(at::ScalarType dtype);

// block_dim must be 1 (1x128 blocks) or 2 (128x128 tiles).
void check_fp8_block_dim(const char* op, int64_t block_dim);

// fp8_block_quantize(x, fp8_dtype, block_dim, force_pow_2_scales, amax_epsilon)
//   -> (data, scale_inv): data uint8 in x's shape (at least 1-D), scale_inv fp32 as above.
struct Fp8BlockQuantize {
  static constexpr const char* kName = "fp8_block_quantize";
  static void check(const Tensor& x, at::ScalarType fp8_dtype, int64_t block_dim,
                    double amax_epsilon);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, int64_t block_dim);
};

// fp8_block_dequantize(data, scale_inv, fp8_dtype, block_dim, dtype) -> data * scale_inv per
// block, in dtype; scale_inv must have the shape fp8_block_quantize gives for data's shape.
struct Fp8BlockDequantize {
  static constexpr const char* kName = "fp8_block_dequantize";
  static void check(const Tensor& data, const Tensor& scale_inv, at::ScalarType fp8_dtype,
                    int64_t block_dim, at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

}  // namespace te_cpp
