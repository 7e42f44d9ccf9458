// Operator classes of the quantize family: FP8 per-tensor current and delayed scaling, and
// MXFP8 (32-element blocks with E8M0 scales). FP8 crosses the ops as plain buffers: `data`
// (uint8, the input's shape) and `scale_inv` (float32, shape (1,)) or `scale_e8m0` (uint8, one
// per block), with the format as its torch dtype (`ScalarType fp8_dtype`: float8_e4m3fn or
// float8_e5m2). Each class has one check and one allocation, shared by the Meta kernel and the
// front end (ops/quantize.cpp); the backends implement the stubs below on contiguous buffers.
// The rules that decide the bits (scale from amax, the cast, the E8M0 exponent) are
// common/fp8.h's, shared by every backend. See docs/quantization.md.
#pragma once

#include "common/backend.h"
#include "common/common.h"
#include "common/fp8.h"

#include <tuple>

namespace te_cpp {

// The input dtypes the quantize kernels read (the front end rounds float64 to float32).
#define TE_DISPATCH_QUANT_INPUT(TYPE, NAME, ...)              \
  AT_DISPATCH_SWITCH(TYPE, NAME,                              \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

// ---- backend stubs (pointers to contiguous device buffers of the front end's device) --------

// Per-tensor FP8 quantization of the n >= 0 elements of x (dtype float32, bfloat16 or float16;
// the front end rounds float64 to float32):
//   *amax = max |x| in fp32, NaN elements skipped (the fp8::abs_bits_skip_nan maximum, as
//           TransformerEngine's fmaxf reduction; 0 when n = 0 or every element is NaN);
//   scale = *scale when `scale` is given (delayed scaling), else
//           fp8::compute_scale(*amax, max_norm(fp8_dtype), force_pow_2_scales, amax_epsilon);
//   data[i] = fp8::cast_to_fp8(float(x[i]) * scale); *scale_inv = fp8::scale_inv(scale).
// A backend reads every scalar it needs (amax, scale) from device memory: no host round trip.
struct Fp8QuantizeArgs {
  at::ScalarType dtype, fp8_dtype;
  int64_t n;
  const void* x;
  const float* scale;  // nullptr: current scaling
  bool force_pow_2_scales;
  float amax_epsilon;
  uint8_t* data;
  float* scale_inv;
  float* amax;
};
TE_DECLARE_STUB(fp8_quantize_stub, void(const Fp8QuantizeArgs&));

// *amax = max |x| in fp32 over the n >= 0 elements of x (dtype as Fp8QuantizeArgs): the same
// reduction, and the same bits, as fp8_quantize_stub's amax (0 when n = 0).
struct Fp8AmaxArgs {
  at::ScalarType dtype;
  int64_t n;
  const void* x;
  float* amax;
};
TE_DECLARE_STUB(fp8_amax_stub, void(const Fp8AmaxArgs&));

// *scale = fp8::compute_scale(*amax, max_norm(fp8_dtype), force_pow_2_scales, amax_epsilon),
// amax read from device memory (no host round trip).
struct Fp8CurrentScaleArgs {
  at::ScalarType fp8_dtype;
  bool force_pow_2_scales;
  float amax_epsilon;
  const float* amax;
  float* scale;
};
TE_DECLARE_STUB(fp8_current_scale_stub, void(const Fp8CurrentScaleArgs&));

// out[i] = out_dtype(fp8_to_float(data[i]) * s), the product in fp32, over n > 0 elements:
// s = *scale_inv (per tensor), or with `e8m0` given, s = e8m0_to_float(e8m0[i / 32]) (MXFP8).
struct Fp8DequantizeArgs {
  at::ScalarType fp8_dtype, out_dtype;
  int64_t n;
  const uint8_t* data;
  const float* scale_inv;  // per-tensor scale (nullptr for MXFP8)
  const uint8_t* e8m0;     // MXFP8 block exponents (nullptr for per tensor)
  void* out;
};
TE_DECLARE_STUB(fp8_dequantize_stub, void(const Fp8DequantizeArgs&));

// MXFP8 quantization of nblocks > 0 consecutive blocks of 32 elements of x (dtype float32,
// bfloat16 or float16): per block, amax = max |x| skipping NaN elements,
// e = fp8::mxfp8_block_exponent(amax), scales[b] = e, data = cast_to_fp8(x * e8m0_rcp(e)).
// transposed_rows > 0 (CPU backend only; the front ends pass 0 to others): x is stored as the
// row-major [transposed_rows, cols] matrix X (transposed_rows % 32 == 0) and the quantized
// tensor is its transpose [cols, transposed_rows], read in place.
struct Mxfp8QuantizeArgs {
  at::ScalarType dtype, fp8_dtype;
  int64_t nblocks;
  const void* x;
  uint8_t* data;
  uint8_t* scales;
  int64_t transposed_rows = 0;
};
TE_DECLARE_STUB(mxfp8_quantize_stub, void(const Mxfp8QuantizeArgs&));

// Delayed scaling's update of `columns` quantizers in place, on history (length x columns, row
// major) and scale (columns): per column j, amax = fp8::history_max over history[:, j]
// (most_recent: history[0, j]); the history rolled up by one row (row i takes row i + 1, the
// last row takes row 0) and row 0 zeroed; scale[j] = fp8::delayed_scale(amax, scale[j], ...).
struct DelayedScalingUpdateArgs {
  int64_t length, columns;
  bool most_recent;
  float fp8_max, margin_div;
  float* history;
  float* scale;
};
TE_DECLARE_STUB(delayed_scaling_update_stub, void(const DelayedScalingUpdateArgs&));

// fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2.
void check_fp8_dtype(const char* op, at::ScalarType fp8_dtype);

// amax_epsilon (the floor of an amax) must be finite and >= 0: NaN fails the comparison, and
// inf would floor every amax to inf, i.e. scale 1 silently. A grouped op passes the group
// (>= 0), which the error names as "amax_epsilons[group]".
void check_amax_epsilon(const char* op, double amax_epsilon, int64_t group = -1);

// fp8_quantize(x, fp8_dtype, force_pow_2_scales, amax_epsilon) -> (data, scale_inv, amax):
// current scaling. amax is this tensor's max |x| in fp32, shape (1,).
struct Fp8Quantize {
  static constexpr const char* kName = "fp8_quantize";
  static void check(const Tensor& x, at::ScalarType fp8_dtype, double amax_epsilon);
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x);
};

// Current scaling in three steps, for an amax reduced over a process group between the first
// two (TransformerEngine's amax reduction under tensor parallelism):
//   fp8_amax(x) -> amax: fp8_quantize's amax (fp32, shape (1,));
//   fp8_current_scale(amax, fp8_dtype, force_pow_2_scales, amax_epsilon) -> scale: fp32,
//     shape (1,), the scale fp8_quantize derives from that amax;
// then fp8_quantize_scaled(x, scale, fp8_dtype) gives fp8_quantize's data, scale_inv, amax.
struct Fp8Amax {
  static constexpr const char* kName = "fp8_amax";
  static void check(const Tensor& x);
  static Tensor allocate(const Tensor& x);
};

// amax: float32 with exactly one element (any shape).
struct Fp8CurrentScale {
  static constexpr const char* kName = "fp8_current_scale";
  static void check(const Tensor& amax, at::ScalarType fp8_dtype, double amax_epsilon);
  static Tensor allocate(const Tensor& amax);
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

// fp8_delayed_scaling_update(amax_history!, scale!, fp8_max, margin, amax_compute_algo) -> ():
// amax_history float32 [length >= 1, n], scale float32 [n], on one device, any strides (a
// non-contiguous one is updated through a contiguous copy), not overlapping;
// amax_compute_algo "max" or "most_recent".
struct Fp8DelayedScalingUpdate {
  static constexpr const char* kName = "fp8_delayed_scaling_update";
  static void check(const Tensor& amax_history, const Tensor& scale, double fp8_max,
                    int64_t margin, c10::string_view amax_compute_algo);
};

}  // namespace te_cpp
