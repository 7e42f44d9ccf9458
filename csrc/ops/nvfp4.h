// Operator classes of NVFP4 (TransformerEngine's NVFP4BlockScaling): FP4 E2M1 values packed two
// per byte with an E4M3 scale per 16-element block and a per-tensor fp32 amax. Each class has
// one check and one allocation, shared by the Meta kernel and the front end (ops/nvfp4.cpp);
// the backends implement the stubs below on contiguous buffers with common/fp4.h's rules.
//
// nvfp4_quantize(x, rht, block_2d, sr_seed) -> (data, scale_e4m3, amax), on the 2-D view
// [rows, cols] of x (rows = product of the leading dims, cols % 16 == 0):
//   v = x in fp32, or with rht each run of 16 along the last dim replaced by fp4::rht16 of it;
//   amax = max |v| over the tensor (NaN elements skipped, as TransformerEngine's amax kernels
//   do; 0 for an empty or all-NaN tensor), shape [1];
//   S_enc = fp4::global_encode_scale(amax);
//   per block (16 consecutive elements of a row; with block_2d the 16x16 tile of rows
//   16g .. 16g + 15 (fewer in the last group) and the same 16 columns, whose scale every row of
//   the tile repeats): block_amax = max |v| over it (NaN elements skipped),
//   scale = fp4::block_scale_e4m3(block_amax, S_enc), e = fp4::block_encode_scale(scale, S_enc),
//   code = fp4::e2m1_rne(v * e), or with sr_seed fp4::e2m1_stochastic(v * e, r) with r the draw
//   of element i = row * cols + col: Philox4x32-10 keyed by the seed (dropout::engine_at);
//   data[row, k] = code(2k) | code(2k + 1) << 4 (uint8, x's shape with the last dim / 2),
//   scale_e4m3 uint8 E4M3 bytes (x's shape with the last dim / 16).
// nvfp4_dequantize(data, scale_e4m3, amax, rht, dtype): value = fp4::e2m1_to_float(code) *
//   fp4::dequant_scale(scale, amax) in fp32; with rht each run of 16 is mapped back with
//   fp4::rht16_inverse; the result in dtype, shape data's with the last dim * 2.
#pragma once

#include "common/backend.h"
#include "common/common.h"
#include "common/fp4.h"

#include <tuple>

namespace te_cpp {

struct Nvfp4QuantizeArgs {
  at::ScalarType dtype;  // float32, bfloat16 or float16
  int64_t rows, cols;    // rows * cols > 0, cols % 16 == 0
  const void* x;
  bool rht, block_2d;
  const int64_t* seed;  // nullptr: round to nearest even
  uint8_t* data;
  uint8_t* scales;
  float* amax;
};
TE_DECLARE_STUB(nvfp4_quantize_stub, void(const Nvfp4QuantizeArgs&));

struct Nvfp4DequantizeArgs {
  at::ScalarType out_dtype;
  int64_t rows, cols;  // logical (unpacked) cols
  const uint8_t* data;
  const uint8_t* scales;
  const float* amax;
  bool rht;
  void* out;
};
TE_DECLARE_STUB(nvfp4_dequantize_stub, void(const Nvfp4DequantizeArgs&));

struct Nvfp4Quantize {
  static constexpr const char* kName = "nvfp4_quantize";
  static void check(const Tensor& x, const c10::optional<Tensor>& sr_seed);
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x);
};

struct Nvfp4Dequantize {
  static constexpr const char* kName = "nvfp4_dequantize";
  static void check(const Tensor& data, const Tensor& scale_e4m3, const Tensor& amax,
                    at::ScalarType dtype);
  static Tensor allocate(const Tensor& data, at::ScalarType dtype);
};

}  // namespace te_cpp
