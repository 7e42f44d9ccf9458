// Philox4x32-10 (ATen's philox_engine, the draws of common/dropout_math.h) on vectors: one
// counter per 32-bit lane, the same rounds as philox_engine::rand, so every draw has the
// engine's bits. philox_draws gives the draws of kPhiloxLanes consecutive counters (4 each)
// in the engine's order.
#pragma once

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#define TE_PHILOX_SIMD 1

namespace te_cpp::cpu {

namespace philox {
constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;  // the key's increments per round
constexpr uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;  // the round multipliers
}  // namespace philox

#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kPhiloxLanes = 16;
using PhiloxVec = __m512i;

// The 64-bit products x * m lane by lane, as their low and high 32-bit halves: vpmuludq
// multiplies the even lanes, and the odd lanes shifted down.
inline void mulhilo(PhiloxVec x, uint32_t m, PhiloxVec& lo, PhiloxVec& hi) {
  const __m512i mv = _mm512_set1_epi32(static_cast<int>(m));
  const __m512i even = _mm512_mul_epu32(x, mv);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), mv);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// The counters q0, q0 + 1, ... as 64 bits: low words, and high words with the low words'
// carry.
inline void counters(uint64_t q0, PhiloxVec& c0, PhiloxVec& c1) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(q0))), lane);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(q0 >> 32)));
  c1 = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(c0, lane), hi, _mm512_set1_epi32(1));
}

// out[4 l + k] = word k of counter l: per 128-bit chunk c the words of counters 4c .. 4c + 3
// are transposed (unpacks), then the chunks ordered (u_m's chunk c is output chunk 4c + m).
inline void store_words(uint32_t* out, PhiloxVec c0, PhiloxVec c1, PhiloxVec c2, PhiloxVec c3) {
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  auto out_chunks = [&](auto v) {  // [u0, u1, u2, u3] chunk v
    constexpr int kV = decltype(v)::value;
    constexpr int kSel = kV | (kV << 2) | (kV << 4) | (kV << 6);
    const __m512i p = _mm512_shuffle_i32x4(u0, u1, kSel);  // u0_v, u0_v, u1_v, u1_v
    const __m512i q = _mm512_shuffle_i32x4(u2, u3, kSel);  // u2_v, u2_v, u3_v, u3_v
    _mm512_storeu_si512(out + 16 * kV, _mm512_shuffle_i32x4(p, q, 0x88));  // p0 p2 q0 q2
  };
  out_chunks(std::integral_constant<int, 0>{});
  out_chunks(std::integral_constant<int, 1>{});
  out_chunks(std::integral_constant<int, 2>{});
  out_chunks(std::integral_constant<int, 3>{});
}
#else
constexpr int64_t kPhiloxLanes = 8;
using PhiloxVec = __m256i;

inline void mulhilo(PhiloxVec x, uint32_t m, PhiloxVec& lo, PhiloxVec& hi) {
  const __m256i mv = _mm256_set1_epi32(static_cast<int>(m));
  const __m256i even = _mm256_mul_epu32(x, mv);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), mv);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

inline void counters(uint64_t q0, PhiloxVec& c0, PhiloxVec& c1) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(q0))), lane);
  // the low word wrapped where it is below its lane (an unsigned compare: the sign bits flipped)
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);
  const __m256i carry =
      _mm256_cmpgt_epi32(_mm256_xor_si256(lane, flip), _mm256_xor_si256(c0, flip));
  c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(q0 >> 32))),
                        carry);
}

inline void store_words(uint32_t* out, PhiloxVec c0, PhiloxVec c1, PhiloxVec c2, PhiloxVec c3) {
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  auto st = [&](int v, __m256i x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * v), x);
  };
  st(0, _mm256_permute2x128_si256(u0, u1, 0x20));
  st(1, _mm256_permute2x128_si256(u2, u3, 0x20));
  st(2, _mm256_permute2x128_si256(u0, u1, 0x31));
  st(3, _mm256_permute2x128_si256(u2, u3, 0x31));
}
#endif

inline PhiloxVec pxor(PhiloxVec a, PhiloxVec b) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_xor_si512(a, b);
#else
  return _mm256_xor_si256(a, b);
#endif
}

inline PhiloxVec psplat(uint32_t v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_set1_epi32(static_cast<int>(v));
#else
  return _mm256_set1_epi32(static_cast<int>(v));
#endif
}

// out[4 l + k], l < kPhiloxLanes: draw k of counter q0 + l (subsequence 0, key = seed), i.e.
// the draws of elements 4 q0 .. 4 (q0 + kPhiloxLanes) - 1 (dropout::engine_at's order).
inline void philox_draws(uint64_t seed, uint64_t q0, uint32_t* out) {
  PhiloxVec c0, c1;
  counters(q0, c0, c1);
  PhiloxVec c2 = psplat(0), c3 = psplat(0);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    PhiloxVec lo0, hi0, lo1, hi1;
    mulhilo(c0, philox::kM0, lo0, hi0);
    mulhilo(c2, philox::kM1, lo1, hi1);
    const PhiloxVec n0 = pxor(pxor(hi1, c1), psplat(k0));
    const PhiloxVec n2 = pxor(pxor(hi0, c3), psplat(k1));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += philox::kW0;
    k1 += philox::kW1;
  }
  store_words(out, c0, c1, c2, c3);
}

}  // namespace te_cpp::cpu

#endif
