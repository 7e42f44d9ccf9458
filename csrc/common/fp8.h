// FP8 scalar math shared by the quantize kernels: the formats and their limits, the
// current-scaling scale rule, the saturating cast, and MXFP8's E8M0 block scale. Everything here
// is plain fp32 bit arithmetic, the same on every backend (docs/fp8.md states each rule and
// where it comes from).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/bit_cast.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

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
constexpr float max_norm(c10::ScalarType f) { return f == kE4M3 ? 448.0f : 57344.0f; }

// Current scaling (TransformerEngine compute_scale_from_amax): amax floored at epsilon; amax 0,
// inf or NaN gives 1; otherwise fp8_max / amax (one correctly rounded fp32 division), +inf ->
// FLT_MAX; with pow2, only the sign and exponent bits are kept (rounds down to a power of two).
inline float compute_scale(float amax, float fp8_max, bool pow2, float epsilon) {
  if (amax < epsilon) amax = epsilon;
  float scale = 1.0f;
  if (amax == 0.0f || std::isinf(amax) || std::isnan(amax)) return scale;
  scale = fp8_max / amax;
  if (std::isinf(scale)) scale = FLT_MAX;
  if (std::isnan(scale)) scale = 1.0f;
  if (pow2) scale = c10::bit_cast<float>(c10::bit_cast<uint32_t>(scale) & 0xFF800000u);
  return scale;
}

// Round-to-nearest-even cast with saturation to +-fp8_max (SATFINITE: +-inf saturate too);
// NaN stays NaN. c10's conversions round to nearest even and map overflow to NaN (E4M3) or
// inf (E5M2), so the value is clamped first; comparisons with NaN are false, so NaN passes.
template <c10::ScalarType F>
inline uint8_t cast_to_fp8(float v) {
  constexpr float m = max_norm(F);
  v = v > m ? m : (v < -m ? -m : v);
  if constexpr (F == kE4M3) {
    return c10::Float8_e4m3fn(v).x;
  } else {
    return c10::Float8_e5m2(v).x;
  }
}

template <c10::ScalarType F>
inline float fp8_to_float(uint8_t b) {
  if constexpr (F == kE4M3) {
    return static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
  } else {
    return static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
  }
}

// MXFP8 block scale (TransformerEngine common/util/ptx.cuh float_to_e8m0, non-Blackwell path;
// the Blackwell path is cvt.rp.satfinite.ue8m0x2.f32, the same rule): the biased exponent of
// v = block_amax * (1/fp8_max), rounded up to the next power of two, saturating at 254.
// NaN -> 255, inf -> 254, 0 -> 0; a subnormal v <= 2^-127 keeps exponent 0.
inline uint8_t float_to_e8m0(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0x00;
  const uint32_t bits = c10::bit_cast<uint32_t>(v);
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
inline float e8m0_rcp(uint8_t e) {
  if (e == 0) return 1.0f;
  if (e == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return c10::bit_cast<float>(static_cast<uint32_t>(254 - e) << 23);
}

// Dequantization scale 2^(e - 127) (exact, 2^-127 for e == 0); NaN for e == 255.
inline float e8m0_to_float(uint8_t e) {
  if (e == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

// Number of consecutive elements (along the last dim) sharing one E8M0 scale.
constexpr int64_t kMXFP8BlockSize = 32;

}  // namespace fp8
}  // namespace te_cpp
