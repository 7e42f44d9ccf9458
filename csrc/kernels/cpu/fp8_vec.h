// FP8 dequantization on whole vectors: out[i] = T(fp8_to_float(data[i]) * s), the product in
// fp32, with the same bytes as the scalar expression `static_cast<T>(table[data[i]] * s)`.
//
// The FP8 bytes become fp32 through the fp16 conversion (F16C, on both the AVX512 and the AVX2
// builds) instead of a 256-entry table gather: E5M2 is the upper byte of an fp16, and E4M3's
// exponent and mantissa bits, moved to an fp16's (7 bits left), give its value times 2^-8,
// denormals included, so one multiply by 256 restores it (every step exact). A vector with a
// NaN (or E5M2 inf) byte, and a span with a multiplier that is not finite, take the scalar
// expression, so NaN bit patterns are the scalar ones (rare in dequantized data). The fp32 products
// are rounded to bfloat16 with c10's integer round-to-nearest-even (vcvtneps2bf16 would flush
// fp32 denormal products, which MXFP8's small block scales make, to zero) and to float16 with
// vcvtps2ph, the instruction c10::Half uses itself on an F16C build.
#pragma once

#include <array>

#include "common/fp8.h"
#include "kernels/cpu/vec.h"

namespace te_cpp {

// Calls f(std::integral_constant<c10::ScalarType, F>{}) for the runtime format (checked to be
// kE4M3 or kE5M2 before).
template <typename Fn>
decltype(auto) visit_format(at::ScalarType fmt, const Fn& f) {
  if (fmt == fp8::kE4M3) return f(std::integral_constant<c10::ScalarType, fp8::kE4M3>{});
  return f(std::integral_constant<c10::ScalarType, fp8::kE5M2>{});
}

template <c10::ScalarType F>
std::array<float, 256> fp8_value_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = fp8::fp8_to_float<F>(static_cast<uint8_t>(b));
  return t;
}

// fp8_to_float of every byte (the scalar path's values).
template <c10::ScalarType F>
const std::array<float, 256>& fp8_values() {
  static const std::array<float, 256> t = fp8_value_table<F>();
  return t;
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// One vector (Vectorized<float>::size() elements) of T, from the fp32 products p, NaN-free.
// kNormal: no p is an fp32 denormal, so that vcvtneps2bf16 (where the build has it) rounds to
// bfloat16 as c10 does.
template <typename T, bool kNormal>
inline void store_products(T* o, const at::vec::Vectorized<float>& p) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if constexpr (kNormal && std::is_same_v<T, c10::BFloat16>) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p)));
    return;
  }
#endif
  if constexpr (std::is_same_v<T, float>) {
    p.store(o);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
#if defined(CPU_CAPABILITY_AVX512)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                        _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                     _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  } else {
    static_assert(std::is_same_v<T, c10::BFloat16>);
    // c10::round_to_nearest_even: (u + 0x7FFF + ((u >> 16) & 1)) >> 16
#if defined(CPU_CAPABILITY_AVX512)
    const __m512i u = _mm512_castps_si512(p);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, odd), _mm512_set1_epi32(0x7FFF)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi32_epi16(r));
#else
    const __m256i u = _mm256_castps_si256(p);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, odd), _mm256_set1_epi32(0x7FFF)), 16);
    // the 8 results are < 2^16: packus keeps them, then the two 64-bit halves side by side
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(pk));
#endif
  }
}

// Vectorized<float>::size() FP8 bytes at d times m (fp32), where m is the multiplier s for
// E5M2 and 256 s for E4M3 (the fp16 conversion gives E4M3 values times 2^-8); `nan`: whether a
// byte is NaN, or for E5M2 also infinite (inf * 0 is a NaN product, which the scalar path rounds
// to bfloat16 its own way).
#if defined(CPU_CAPABILITY_AVX512)
using FloatReg = __m512;
#else
using FloatReg = __m256;
#endif

template <c10::ScalarType F>
inline FloatReg load_fp8_times(const uint8_t* d, FloatReg m, bool& nan) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d));
  // E4M3 NaN: 0x7F / 0xFF; E5M2 inf or NaN: a magnitude from 0x7C
  nan = (F == fp8::kE4M3 ? _mm_cmpeq_epi8_mask(_mm_or_si128(b, _mm_set1_epi8(-128)),
                                              _mm_set1_epi8(-1))
                         : _mm_cmpgt_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7F)),
                                               _mm_set1_epi8(0x7B))) != 0;
  const __m256i w = _mm256_cvtepu8_epi16(b);
  if constexpr (F == fp8::kE5M2) {
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_slli_epi16(w, 8)), m);
  } else {
    // w << 7: the magnitude in bits 13..7 and the sign in bit 14, which adding that bit to
    // itself moves to bit 15
    const __m256i v = _mm256_slli_epi16(w, 7);
    const __m256i h = _mm256_add_epi16(v, _mm256_and_si256(v, _mm256_set1_epi16(0x4000)));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), m);
  }
#else
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(d));
  const __m128i bad = F == fp8::kE4M3
                          ? _mm_cmpeq_epi8(_mm_or_si128(b, _mm_set1_epi8(-128)), _mm_set1_epi8(-1))
                          : _mm_cmpgt_epi8(_mm_and_si128(b, _mm_set1_epi8(0x7F)),
                                           _mm_set1_epi8(0x7B));
  nan = (_mm_movemask_epi8(bad) & 0xFF) != 0;
  const __m128i w = _mm_cvtepu8_epi16(b);
  if constexpr (F == fp8::kE5M2) {
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_slli_epi16(w, 8)), m);
  } else {
    const __m128i v = _mm_slli_epi16(w, 7);
    const __m128i h = _mm_add_epi16(v, _mm_and_si128(v, _mm_set1_epi16(0x4000)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), m);
  }
#endif
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <c10::ScalarType F, typename T, bool kNormal>
inline int64_t dequantize_vectors(const uint8_t* __restrict d, T* __restrict o, int64_t n,
                                  float s, float m) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  const std::array<float, 256>& table = fp8_values<F>();
  const V mv(m);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    bool nan;
    const V p(load_fp8_times<F>(d + i, mv, nan));
    if (!nan) {
      store_products<T, kNormal>(o + i, p);
    } else {
      for (int64_t j = i; j < i + W; ++j) o[j] = static_cast<T>(table[d[j]] * s);
    }
  }
  return i;
}
#endif

// out[i] = T(fp8_to_float(d[i]) * s) for i < n (one multiplier over the span). The vector
// path multiplies the fp16-converted values by 256 s (E4M3) in one step: the exact product is
// the same real number, rounded once either way, while 256 s is exact (finite). A NaN, an
// infinite multiplier, or 256 s overflowing leaves the span to the scalar expression. With
// |s| at least 2^-126 over the format's smallest nonzero magnitude (2^-9 E4M3, 2^-16 E5M2),
// no product is an fp32 denormal.
template <c10::ScalarType F, typename T>
inline void dequantize_span(const uint8_t* __restrict d, T* __restrict o, int64_t n, float s) {
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    const float m = F == fp8::kE4M3 ? s * 256.0f : s;
    if (fp8::abs_bits(m) < fp8::kInfBits) {  // finite
      constexpr uint32_t kMinNormalS = (F == fp8::kE4M3 ? 127u - 126u + 9u : 127u - 126u + 16u)
                                       << 23;  // 2^-117, 2^-110
      i = fp8::abs_bits(s) >= kMinNormalS ? dequantize_vectors<F, T, true>(d, o, n, s, m)
                                          : dequantize_vectors<F, T, false>(d, o, n, s, m);
    }
  }
#endif
  const std::array<float, 256>& table = fp8_values<F>();
  for (; i < n; ++i) o[i] = static_cast<T>(table[d[i]] * s);
}

}  // namespace te_cpp
