// FP8 scalar math shared by the quantize kernels of every backend: the formats and their
// limits, the current-scaling scale rule, the saturating cast, and MXFP8's E8M0 block scale.
// Everything here is plain fp32 bit arithmetic, C10_HOST_DEVICE, the same on every backend:
// the CPU kernels (their scalar paths) and the CUDA kernels call these functions, so the CPU
// suite checks the rules the GPU runs (docs/quantization.md states each rule and where it comes
// from).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/bit_cast.h>

#include <cstdint>

namespace te_cpp {
namespace fp8 {

// The FP8 formats, named in the schemas by their torch dtype (ScalarType fp8_dtype):
// torch.float8_e4m3fn (E4M3) and torch.float8_e5m2 (E5M2). The kernels take the format as a
// template argument of this type.
constexpr c10::ScalarType kE4M3 = c10::ScalarType::Float8_e4m3fn;
constexpr c10::ScalarType kE5M2 = c10::ScalarType::Float8_e5m2;

constexpr bool is_fp8(c10::ScalarType t) { return t == kE4M3 || t == kE5M2; }

// Largest finite value of the format: 448 (E4M3) and 57344 (E5M2). The only place these limits
// are written on the C++ side.
C10_HOST_DEVICE constexpr float max_norm(c10::ScalarType f) {
  return f == kE4M3 ? 448.0f : 57344.0f;
}

constexpr float kFltMax = 3.40282346638528859812e+38f;

// fp32 <-> its bits (host: c10::bit_cast; device: the intrinsics).
C10_HOST_DEVICE inline uint32_t bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  return c10::bit_cast<uint32_t>(v);
#endif
}
C10_HOST_DEVICE inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return c10::bit_cast<float>(b);
#endif
}

// Classification on the bits (valid in host and device code, no std:: calls).
C10_HOST_DEVICE inline bool is_nan(float v) { return (bits_of(v) & 0x7FFFFFFFu) > 0x7F800000u; }
C10_HOST_DEVICE inline bool is_inf(float v) { return (bits_of(v) & 0x7FFFFFFFu) == 0x7F800000u; }

// |v| as its bits: the order of these integers is the order of the magnitudes, with every NaN
// above +inf.
C10_HOST_DEVICE inline uint32_t abs_bits(float v) { return bits_of(v) & 0x7FFFFFFFu; }

// abs_bits with NaN counted as 0: the maximum of these is an amax that skips NaN elements
// (TransformerEngine's amax kernels reduce with fmaxf / __hmax, which return the other
// operand of a NaN), still an exact, order-free integer maximum. Every amax of a tensor or
// block is one: the per-tensor amax of current and delayed scaling and NVFP4's, from 0, so an
// empty or all-NaN tensor has amax 0 (and scale 1), and a NaN changes only its own code.
// +inf's bits in fp32, and in bfloat16 (kBf16 true) or float16: every NaN's magnitude bits are
// above them.
constexpr uint32_t kInfBits = 0x7F800000u;
template <bool kBf16>
constexpr uint32_t kInfBits16 = kBf16 ? 0x7F80u : 0x7C00u;

C10_HOST_DEVICE inline uint32_t abs_bits_skip_nan(float v) {
  const uint32_t m = abs_bits(v);
  return m > kInfBits ? 0u : m;
}

// The same key on the 16 bits of a bfloat16 (kBf16 true) or float16 value, without the
// conversion to fp32: |v| as its 16 bits, NaN counted as 0. Its order is the order of the
// magnitudes, as for abs_bits_skip_nan.
template <bool kBf16>
C10_HOST_DEVICE inline uint32_t abs_bits16_skip_nan(uint16_t bits) {
  const uint32_t m = bits & 0x7FFFu;
  return m > kInfBits16<kBf16> ? 0u : m;
}

// Current scaling (TransformerEngine compute_scale_from_amax): amax floored at epsilon; amax 0,
// inf or NaN gives 1; otherwise fp8_max / amax (one correctly rounded fp32 division), +inf ->
// FLT_MAX; with pow2, only the sign and exponent bits are kept (rounds down to a power of two).
// `value_for_inf` replaces a +inf quotient: FLT_MAX for per-tensor current scaling; the block
// scaling kernels pass the input dtype's largest finite value (TransformerEngine
// compute_scale_from_types), rounded down to a power of two with pow2 like any scale.
C10_HOST_DEVICE inline float compute_scale(float amax, float fp8_max, bool pow2, float epsilon,
                                           float value_for_inf = kFltMax) {
  if (amax < epsilon) amax = epsilon;
  float scale = 1.0f;
  if (amax == 0.0f || is_inf(amax) || is_nan(amax)) return scale;
  scale = fp8_max / amax;
  if (is_inf(scale)) scale = value_for_inf;
  if (is_nan(scale)) scale = 1.0f;
  if (pow2) scale = float_of(bits_of(scale) & 0xFF800000u);
  return scale;
}

// The dequantization scale returned beside the data: 1 / scale in fp32 (correctly rounded).
C10_HOST_DEVICE inline float scale_inv(float scale) { return 1.0f / scale; }

// Round-to-nearest-even cast with saturation to +-fp8_max (SATFINITE: +-inf saturate too);
// NaN stays NaN. c10's conversions round to nearest even and map overflow to NaN (E4M3) or
// inf (E5M2), so the value is clamped first; comparisons with NaN are false, so NaN passes.
template <c10::ScalarType F>
C10_HOST_DEVICE inline uint8_t cast_to_fp8(float v) {
  constexpr float m = max_norm(F);
  v = v > m ? m : (v < -m ? -m : v);
  if constexpr (F == kE4M3) {
    return c10::Float8_e4m3fn(v).x;
  } else {
    return c10::Float8_e5m2(v).x;
  }
}

template <c10::ScalarType F>
C10_HOST_DEVICE inline float fp8_to_float(uint8_t b) {
  if constexpr (F == kE4M3) {
    return static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
  } else {
    return static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
  }
}

// The fp32 constant MXFP8 multiplies a block's amax by: float(1 / fp8_max), the reciprocal
// taken in double and rounded once.
template <c10::ScalarType F>
C10_HOST_DEVICE constexpr float max_norm_rcp() {
  return static_cast<float>(1.0 / static_cast<double>(max_norm(F)));
}

// MXFP8 block scale (TransformerEngine common/util/ptx.cuh float_to_e8m0, non-Blackwell path;
// the Blackwell path is cvt.rp.satfinite.ue8m0x2.f32, the same rule): the biased exponent of
// v = block_amax * (1/fp8_max), rounded up to the next power of two, saturating at 254.
// NaN -> 255, inf -> 254, 0 -> 0; a subnormal v <= 2^-127 keeps exponent 0.
C10_HOST_DEVICE inline uint8_t float_to_e8m0(float v) {
  if (is_nan(v)) return 0xFF;
  if (is_inf(v)) return 0xFE;
  if (v == 0.0f) return 0x00;
  const uint32_t bits = bits_of(v);
  uint8_t exponent = static_cast<uint8_t>(bits >> 23);
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if ((mantissa > 0 && exponent != 0xFE) && !(exponent == 0 && mantissa <= 0x400000u)) {
    ++exponent;
  }
  return exponent;
}

// The multiplier applied before the cast (TransformerEngine exp2f_rcp): 2^(127 - e) as fp32 bits
// (254 - e) << 23, and 1 for e == 0. For e == 254 this is the bit pattern 0, i.e. 0.0.
// e == 255 (NaN) does not arise from a NaN-ignoring block amax; it gives NaN here.
C10_HOST_DEVICE inline float e8m0_rcp(uint8_t e) {
  if (e == 0) return 1.0f;
  if (e == 0xFF) return float_of(0x7FC00000u);
  return float_of(static_cast<uint32_t>(254 - e) << 23);
}

// Dequantization scale 2^(e - 127), exact: the fp32 bits e << 23 for e >= 1, the subnormal
// 2^-127 (bits 1 << 22) for e == 0; NaN for e == 255.
C10_HOST_DEVICE inline float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return float_of(0x7FC00000u);
  if (e == 0) return float_of(0x00400000u);
  return float_of(static_cast<uint32_t>(e) << 23);
}

// MXFP8 quantization of one block's values given its amax (max |x| over the block, NaN
// elements skipped): the E8M0 exponent, and the multiplier every element of the block is
// scaled by before cast_to_fp8.
template <c10::ScalarType F>
C10_HOST_DEVICE inline uint8_t mxfp8_block_exponent(float block_amax) {
  return float_to_e8m0(block_amax * max_norm_rcp<F>());
}

// Delayed scaling's update (the recipe state's rule, as TransformerEngine's fused amax and scale
// update): amax over the history is a NaN-propagating maximum (torch.amax: a NaN anywhere gives
// NaN, whatever the order); the new scale is (fp8_max / amax) / 2^margin (two fp32 divisions,
// margin_div = float(2^margin), +inf for margin >= 128), the old scale where amax <= 0 or is
// not finite, and FLT_MAX where the result is +-inf.
C10_HOST_DEVICE inline float history_max(float m, float v) { return (is_nan(v) || v > m) ? v : m; }

C10_HOST_DEVICE inline float delayed_scale(float amax, float old_scale, float fp8_max,
                                           float margin_div) {
  float sf = (fp8_max / amax) / margin_div;
  if (!(amax > 0.0f) || is_nan(amax) || is_inf(amax)) sf = old_scale;
  if (is_inf(sf)) sf = kFltMax;
  return sf;
}

// Number of consecutive elements (along the last dim) sharing one E8M0 scale.
constexpr int64_t kMXFP8BlockSize = 32;

// ---- Float8BlockScaling (TransformerEngine's Float8BlockQuantizer) ----

// Block edge: 1x128 blocks (128 consecutive elements of a row) or 128x128 tiles.
constexpr int64_t kFp8BlockSize = 128;

// A block's amax accumulates with fmaxf from 0 (TransformerEngine's blockwise kernels): NaN
// elements are skipped, so a block's amax is never NaN (an all-NaN block has amax 0).
C10_HOST_DEVICE inline float block_amax_step(float m, float v) {
  const float a = float_of(abs_bits(v));
  return a > m ? a : m;
}

}  // namespace fp8
}  // namespace te_cpp
