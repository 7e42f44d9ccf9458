// FP8 on whole vectors, with the bytes of common/fp8.h's scalar rules: the cast of fp32 values to
// FP8 codes (fp8_codes, and cast_span over a span with one scale), the NaN-skipping amax of a
// span (amax_span_into), and dequantization.
//
// Dequantization: out[i] = T(fp8_to_float(data[i]) * s), the product in fp32, with the same
// bytes as the scalar expression `static_cast<T>(table[data[i]] * s)`.
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
//
// The per-vector helpers are C10_ALWAYS_INLINE: in a file with many instantiations GCC's
// inlining budget runs out and leaves them as calls, which spill the caller's vector registers.
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
C10_ALWAYS_INLINE void store_products(T* o, const at::vec::Vectorized<float>& p) {
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
C10_ALWAYS_INLINE FloatReg load_fp8_times(const uint8_t* d, FloatReg m, bool& nan) {
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

#if defined(CPU_CAPABILITY_AVX512)
// One full vector of fp32 to FP8 codes, one per 32-bit lane: the same bytes as
// fp8::cast_to_fp8 lane by lane (saturate to +-fp8_max, NaN stays NaN, then c10's
// round-to-nearest-even conversion). Works on the magnitude bits: the saturation is a float
// minimum that passes NaN through (vminps returns its second operand for NaN); for finite lanes
// rounding cannot carry past the largest finite code (0x7E / 0x7B), while a NaN lane's
// magnitude, above +inf, rounds to a code above 0x3B0, so an unsigned minimum with 0x7F makes
// it NaN (0x7F | sign in both formats) and leaves every finite code as it is. The denormal
// fix-up is skipped when no lane needs it (rare in real data; the mask is always computed).
template <c10::ScalarType F>
C10_ALWAYS_INLINE __m512i fp8_codes(__m512 v) {
  constexpr float kMax = fp8::max_norm(F);
  // E4M3: denormal below 2^-6 (exponent 121), 3 mantissa bits (shift 20), bias 7.
  // E5M2: denormal below 2^-14 (exponent 113), 2 mantissa bits (shift 21), bias 15.
  constexpr uint32_t kDenormExp = F == fp8::kE4M3 ? 121u : 113u;
  constexpr uint32_t kDenormMagic = F == fp8::kE4M3 ? 141u : 134u;
  constexpr int kShift = F == fp8::kE4M3 ? 20 : 21;
  constexpr uint32_t kBias = F == fp8::kE4M3 ? 7u : 15u;
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i mag = _mm512_castps_si512(_mm512_min_ps(
      _mm512_set1_ps(kMax),
      _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)))));
  // normal: (mag + ((bias - 127) << 23) + (2^(shift-1) - 1) + odd) >> shift
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(mag, kShift), _mm512_set1_epi32(1));
  const __m512i rnd = _mm512_add_epi32(
      mag, _mm512_set1_epi32(
               static_cast<int>(((kBias - 127u) << 23) + ((1u << (kShift - 1)) - 1u))));
  __m512i r = _mm512_min_epu32(_mm512_srli_epi32(_mm512_add_epi32(rnd, odd), kShift),
                               _mm512_set1_epi32(0x7F));
  const __mmask16 den =
      _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(static_cast<int>(kDenormExp << 23)));
  if (den) {  // the float sum |v| + 2^(magic - 127) rounds at the right place
    const __m512i magic = _mm512_set1_epi32(static_cast<int>(kDenormMagic << 23));
    const __m512i d = _mm512_sub_epi32(
        _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(mag), _mm512_castsi512_ps(magic))),
        magic);
    r = _mm512_mask_mov_epi32(r, den, d);
  }
  // r | ((bits >> 24) & 0x80): the sign bit into bit 7
  return _mm512_ternarylogic_epi32(r, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80),
                                   0xF8);
}

// One vector of fp32 to FP8, stored as 16 bytes at out.
template <c10::ScalarType F>
C10_ALWAYS_INLINE void store_fp8(uint8_t* out, __m512 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(fp8_codes<F>(v)));
}

// Four vectors of fp32 (64 consecutive elements) to FP8, stored as 64 bytes at out: two
// saturating packs (the codes are 0..255) leave, per 128-bit lane k, the elements 4k..4k+3 of
// v0, v1, v2, v3 in turn; one dword permutation puts them in order.
template <c10::ScalarType F>
C10_ALWAYS_INLINE void store_fp8_x4(uint8_t* out, __m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  const __m512i p01 = _mm512_packus_epi32(fp8_codes<F>(v0), fp8_codes<F>(v1));
  const __m512i p23 = _mm512_packus_epi32(fp8_codes<F>(v2), fp8_codes<F>(v3));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(reinterpret_cast<void*>(out),
                      _mm512_permutexvar_epi32(idx, _mm512_packus_epi16(p01, p23)));
}
#elif defined(CPU_CAPABILITY_AVX2)
// The 8 lanes (each 0..255) as the low 8 bytes of the result: two packs leave lanes 0-3 in the
// low 128-bit half's first dword and lanes 4-7 in the high half's, which are then joined.
C10_ALWAYS_INLINE __m128i lane_bytes8(__m256i c) {
  const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c, c), c);
  return _mm_unpacklo_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
}

// The AVX512 fp8_codes on 8 lanes: the same steps, with a signed compare for the denormal
// lanes (every magnitude, NaN included, is below 2^31) and a blend.
template <c10::ScalarType F>
C10_ALWAYS_INLINE __m256i fp8_codes(__m256 v) {
  constexpr float kMax = fp8::max_norm(F);
  constexpr uint32_t kDenormExp = F == fp8::kE4M3 ? 121u : 113u;
  constexpr uint32_t kDenormMagic = F == fp8::kE4M3 ? 141u : 134u;
  constexpr int kShift = F == fp8::kE4M3 ? 20 : 21;
  constexpr uint32_t kBias = F == fp8::kE4M3 ? 7u : 15u;
  const __m256i bits = _mm256_castps_si256(v);
  // vminps returns its second operand when either is NaN: a NaN magnitude passes
  const __m256i mag = _mm256_castps_si256(_mm256_min_ps(
      _mm256_set1_ps(kMax),
      _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)))));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, kShift), _mm256_set1_epi32(1));
  const __m256i rnd = _mm256_add_epi32(
      mag, _mm256_set1_epi32(
               static_cast<int>(((kBias - 127u) << 23) + ((1u << (kShift - 1)) - 1u))));
  __m256i r = _mm256_min_epu32(_mm256_srli_epi32(_mm256_add_epi32(rnd, odd), kShift),
                               _mm256_set1_epi32(0x7F));
  const __m256i den =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(kDenormExp << 23)), mag);
  if (!_mm256_testz_si256(den, den)) {
    const __m256i magic = _mm256_set1_epi32(static_cast<int>(kDenormMagic << 23));
    const __m256i d = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(mag), _mm256_castsi256_ps(magic))),
        magic);
    r = _mm256_blendv_epi8(r, d, den);
  }
  return _mm256_or_si256(
      r, _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
}

// One vector of fp32 to FP8, stored as 8 bytes at out.
template <c10::ScalarType F>
C10_ALWAYS_INLINE void store_fp8(uint8_t* out, __m256 v) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), lane_bytes8(fp8_codes<F>(v)));
}

// Four vectors (32 consecutive elements) to FP8, 32 bytes at out: the packs leave, per 128-bit
// lane k, elements 4k..4k+3 of v0, v1, v2, v3 in turn; one dword permutation orders them.
template <c10::ScalarType F>
C10_ALWAYS_INLINE void store_fp8_x4(uint8_t* out, __m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256i p01 = _mm256_packus_epi32(fp8_codes<F>(v0), fp8_codes<F>(v1));
  const __m256i p23 = _mm256_packus_epi32(fp8_codes<F>(v2), fp8_codes<F>(v3));
  const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), idx));
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// Lane j of the result: the maximum over the 16 lanes of m[j] (a transpose-reduce: 15
// merges of two vectors instead of 16 horizontal reductions). No lane may be NaN.
C10_ALWAYS_INLINE __m512 max_lanes_16(__m512 m[16]) {
  __m512 a[8], c[4], d[2];
  for (int k = 0; k < 8; ++k) {  // per 128-bit chunk: [A', B', A'', B'']
    a[k] = _mm512_max_ps(_mm512_unpacklo_ps(m[2 * k], m[2 * k + 1]),
                         _mm512_unpackhi_ps(m[2 * k], m[2 * k + 1]));
  }
  for (int k = 0; k < 4; ++k) {  // per chunk: [A, B, C, D] over the chunk's 4 elements
    const __m512d x = _mm512_castps_pd(a[2 * k]), y = _mm512_castps_pd(a[2 * k + 1]);
    c[k] = _mm512_max_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int k = 0; k < 2; ++k) {  // chunks [P0|P1, P2|P3, Q0|Q1, Q2|Q3]
    d[k] = _mm512_max_ps(_mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * k], c[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_max_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#elif defined(CPU_CAPABILITY_AVX2)
// Lane j of the result: the maximum over the 8 lanes of m[j] (max_lanes_16 on 8 lanes: 7 merges
// of two vectors). No lane may be NaN.
C10_ALWAYS_INLINE __m256 max_lanes_8(const __m256 m[8]) {
  __m256 a[4], c[2];
  for (int k = 0; k < 4; ++k) {  // per 128-bit half: [A', B', A'', B'']
    a[k] = _mm256_max_ps(_mm256_unpacklo_ps(m[2 * k], m[2 * k + 1]),
                         _mm256_unpackhi_ps(m[2 * k], m[2 * k + 1]));
  }
  for (int k = 0; k < 2; ++k) {  // per half: [A, B, C, D] over the half's 4 elements
    const __m256d x = _mm256_castps_pd(a[2 * k]), y = _mm256_castps_pd(a[2 * k + 1]);
    c[k] = _mm256_max_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_max_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20),
                       _mm256_permute2f128_ps(c[0], c[1], 0x31));
}
#endif

// out[i] = cast_to_fp8(float(x[i]) * scale) over one span, on whole vectors (fp8_codes) and the
// scalar cast for the last partial vector.
template <typename T, c10::ScalarType F>
inline void cast_span(const T* x, uint8_t* out, int64_t n, float scale) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  // locals, so the byte stores (which may alias anything) do not force reloads
  const T* __restrict xl = x;
  uint8_t* __restrict ol = out;
  const V s(scale);
  int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  for (; i + 4 * W <= n; i += 4 * W) {
    store_fp8_x4<F>(ol + i, load_acc<T>(xl + i) * s, load_acc<T>(xl + i + W) * s,
                    load_acc<T>(xl + i + 2 * W) * s, load_acc<T>(xl + i + 3 * W) * s);
  }
  for (; i + W <= n; i += W) store_fp8<F>(ol + i, load_acc<T>(xl + i) * s);
#endif
  alignas(64) float buf[W];
  for (; i < n; i += W) {
    const int64_t k = std::min<int64_t>(W, n - i);
    (load_acc<T>(xl + i, k) * s).store(buf);
    for (int64_t j = 0; j < k; ++j) ol[i + j] = fp8::cast_to_fp8<F>(buf[j]);
  }
}

// acc = the lane-wise maximum of acc and |x[i]| over one span, NaN elements skipped
// (fp8::block_amax_step in any order: the maximum is exact and order-free). A partial last
// vector loads zeros past n. acc holds no NaN.
template <typename T>
inline void amax_span_into(const T* x, int64_t n, at::vec::Vectorized<float>& acc) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  // max(|v|, acc), NaN lanes of v skipped: vmaxps returns its second operand when either is
  // NaN; at::vec::maximum propagates NaN, so there the NaN lanes are zeroed first (v == v is
  // false exactly for NaN, and its all-ones lanes keep |v| in the bitwise and)
  auto step = [](const V& v, const V& m) -> V {
#if defined(CPU_CAPABILITY_AVX512)
    return _mm512_max_ps(_mm512_abs_ps(v), m);
#elif defined(CPU_CAPABILITY_AVX2)
    return _mm256_max_ps(_mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))),
                         m);
#else
    return at::vec::maximum(v.abs() & (v == v), m);
#endif
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) acc = step(load_acc<T>(x + i), acc);
  if (i < n) acc = step(load_acc<T>(x + i, n - i), acc);
}

// The largest lane of a NaN-free vector.
C10_ALWAYS_INLINE float max_lane(const at::vec::Vectorized<float>& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_reduce_max_ps(v);
#elif defined(CPU_CAPABILITY_AVX2)
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
#else
  alignas(64) float lanes[at::vec::Vectorized<float>::size()];
  v.store(lanes);
  float m = 0.0f;
  for (float l : lanes) m = l > m ? l : m;
  return m;
#endif
}

}  // namespace te_cpp
