// NVFP4 scalar math shared by the CPU and CUDA kernels (ops/nvfp4.h states the algorithm):
// the FP4 E2M1 encoding (round to nearest even and stochastic), its decoding, the two-level
// scale rule of TransformerEngine's NVFP4 quantization (a per-tensor fp32 scale from the tensor
// amax, an E4M3 scale per 16-element block), and the 16-point random Hadamard transform.
// Plain fp32 arithmetic, C10_HOST_DEVICE: the CPU suite checks the rules the GPU runs.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

#include "common/fp8.h"

namespace te_cpp {
namespace fp4 {

// Elements per block (one E4M3 scale each) and the side of a 2-D (weight) block.
constexpr int64_t kBlock = 16;

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
// 1/6 rounded to fp32 once (TransformerEngine folds it into the global scale multiplier).
constexpr float kRcp6 = 1.0f / 6.0f;
// 1/(6 * 448) rounded to fp32 once (the dequantization's global factor).
constexpr float kFactorInv = 1.0f / (kE2M1Max * kE4M3Max);

// The magnitude of E2M1 code c & 7: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (bit 3 is the sign).
C10_HOST_DEVICE inline float e2m1_to_float(uint8_t code) {
  const uint8_t m = code & 7u;
  const float mag = m < 4 ? 0.5f * static_cast<float>(m)
                          : (m == 4 ? 2.0f : (m == 5 ? 3.0f : (m == 6 ? 4.0f : 6.0f)));
  return (code & 8u) ? -mag : mag;
}

// The E2M1 code of the exact grid magnitude mag (0 <= mag <= 6, on the grid).
C10_HOST_DEVICE inline uint8_t e2m1_code_of_magnitude(float mag) {
  if (mag < 2.0f) return static_cast<uint8_t>(mag * 2.0f);  // 0, 0.5, 1, 1.5 -> 0..3
  if (mag < 4.0f) return static_cast<uint8_t>(mag + 2.0f);  // 2, 3 -> 4, 5
  return mag < 6.0f ? 6 : 7;                                 // 4 -> 6, 6 -> 7
}

C10_HOST_DEVICE inline uint8_t sign_bit(float v) {
  return static_cast<uint8_t>((fp8::bits_of(v) >> 31) << 3);
}

// Round to nearest, ties to the even code, saturating (|v| > 6 and +-inf give +-6); the sign
// is kept (-0 and a negative value rounding to zero give the code of -0, as the hardware
// conversion keeps the sign of a zero); NaN gives +6 (E2M1 has no NaN; CUDA's FP4 conversion
// maps NaN to positive MAXNORM).
C10_HOST_DEVICE inline uint8_t e2m1_rne(float v) {
  if (fp8::is_nan(v)) return 7;
  const float a = v < 0.0f ? -v : v;
  uint8_t m;
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return static_cast<uint8_t>(sign_bit(v) | m);
}

// Stochastic rounding with the 32-bit draw r: |v| (saturated at 6) lies between grid
// neighbours lo <= |v| < lo + step (step 0.5 below 2, 1 below 4, 2 up to 6); it rounds up iff
// frac > (r >> 8) * 2^-24, frac = (|v| - lo) / step (exact), i.e. with probability frac (exact
// when frac is a multiple of 2^-24, so the rounding is unbiased). Sign and NaN as e2m1_rne.
C10_HOST_DEVICE inline uint8_t e2m1_stochastic(float v, uint32_t r) {
  if (fp8::is_nan(v)) return 7;
  float a = v < 0.0f ? -v : v;
  if (!(a < kE2M1Max)) a = kE2M1Max;  // +-inf and overflow saturate
  const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
  const float q = a / step;  // exact (a power-of-two step)
  const float fl = static_cast<float>(static_cast<int>(q));
  const float frac = q - fl;  // exact
  const float u = static_cast<float>(r >> 8) * (1.0f / 16777216.0f);
  const float mag = (fl + (frac > u ? 1.0f : 0.0f)) * step;  // at most 6
  return static_cast<uint8_t>(sign_bit(v) | e2m1_code_of_magnitude(mag));
}

// The per-tensor encode scale S_enc (TransformerEngine's global encode scaling factor):
// 448 * 6 / amax in fp32, at most FLT_MAX (fminf: a NaN quotient gives FLT_MAX); 1 when amax
// is 0 or the quotient is 0 (amax inf).
C10_HOST_DEVICE inline float global_encode_scale(float amax) {
  float s = (kE4M3Max * kE2M1Max) / amax;
  s = (fp8::is_nan(s) || s > fp8::kFltMax) ? fp8::kFltMax : s;
  if (amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}

// The block's E4M3 decode scale: block_amax * (S_enc * float(1/6)), at most FLT_MAX, cast to
// E4M3 with round to nearest even, saturating at 448 (fp8::cast_to_fp8).
C10_HOST_DEVICE inline uint8_t block_scale_e4m3(float block_amax, float s_enc) {
  float d = block_amax * (s_enc * kRcp6);
  d = (fp8::is_nan(d) || d > fp8::kFltMax) ? fp8::kFltMax : d;
  return fp8::cast_to_fp8<fp8::kE4M3>(d);
}

// The multiplier of the block's elements before the E2M1 cast: 1 / (float(scale) * (1 / S_enc)),
// at most FLT_MAX (a zero scale gives FLT_MAX).
C10_HOST_DEVICE inline float block_encode_scale(uint8_t scale_e4m3, float s_enc) {
  const float s_dec = 1.0f / s_enc;
  const float e = 1.0f / (fp8::fp8_to_float<fp8::kE4M3>(scale_e4m3) * s_dec);
  return (fp8::is_nan(e) || e > fp8::kFltMax) ? fp8::kFltMax : e;
}

// Dequantization (TransformerEngine's NVFP4 dequantize kernel): value = e2m1 * final, with
// final = (float(scale) * amax) * float(1 / (6 * 448)), all in fp32.
C10_HOST_DEVICE inline float dequant_scale(uint8_t scale_e4m3, float amax) {
  return fp8::fp8_to_float<fp8::kE4M3>(scale_e4m3) * amax * kFactorInv;
}

// ---- the random Hadamard transform (16 points) ---------------------------------------------
// M = diag(s) H / 4, H the 16x16 Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and
// s TransformerEngine's fixed sign vector (get_wgrad_sign_vector); M is orthogonal, M^-1 = M^T.
// Bit i of kSignMask is set where s[i] = -1.
constexpr uint32_t kSignMask = 0xD7E8u;  // s = + + + - + - - - - - - + - + - -

C10_HOST_DEVICE constexpr bool h_negative(int i, int j) {
  uint32_t v = static_cast<uint32_t>(i & j);
  v ^= v >> 2;
  v ^= v >> 1;
  return (v & 1u) != 0u;
}

C10_HOST_DEVICE constexpr bool m_negative(int i, int j) {
  return h_negative(i, j) != (((kSignMask >> i) & 1u) != 0u);
}

// y = x M on a block of 16: y[j] = (sum over i = 0..15, in order, of +-x[i]) * 0.25 in fp32.
C10_HOST_DEVICE inline void rht16(const float* x, float* y) {
  for (int j = 0; j < 16; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < 16; ++i) acc = m_negative(i, j) ? acc - x[i] : acc + x[i];
    y[j] = acc * 0.25f;
  }
}

// x = y M^T: x[i] = (sum over j = 0..15, in order, of +-y[j]) * 0.25 in fp32.
C10_HOST_DEVICE inline void rht16_inverse(const float* y, float* x) {
  for (int i = 0; i < 16; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < 16; ++j) acc = m_negative(i, j) ? acc - y[j] : acc + y[j];
    x[i] = acc * 0.25f;
  }
}

}  // namespace fp4
}  // namespace te_cpp
