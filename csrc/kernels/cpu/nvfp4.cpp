// CPU backend of NVFP4 quantize / dequantize (the stubs of ops/nvfp4.h; the scalar rules are
// common/fp4.h's, shared with CUDA). 16-element blocks, parallel over rows (row groups of 16
// for 2-D blocks): every value is a function of its block alone, and the amax is an integer
// maximum of magnitude bit patterns, so the bytes do not depend on the thread count. With AVX-512
// or AVX2 a block is one or two vectors (Block16): the transform, the amaxes, the E2M1 codes and
// the decoding run lane by lane with the scalar rules' bytes (stochastic rounding with each
// row's draws from philox_vec.h), the E4M3 scales of 16 (AVX2: 8) blocks of a row lane by lane;
// the blocks of a dequantization whose scale is outside the range the vector stores round as
// the scalar casts do take the scalar code.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/dropout_math.h"
#include "kernels/cpu/fp8_vec.h"
#include "kernels/cpu/philox_vec.h"
#include "ops/nvfp4.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

constexpr int64_t B = fp4::kBlock;

// The 16 values v of block b of row r (x in fp32, through fp4::rht16 when rht).
template <typename T>
inline void load_block(const T* x, int64_t cols, int64_t r, int64_t b, bool rht, float* v) {
  const T* p = x + r * cols + b * B;
  float t[B];
  for (int64_t j = 0; j < B; ++j) t[j] = static_cast<float>(p[j]);
  if (rht) {
    fp4::rht16(t, v);
  } else {
    std::copy(t, t + B, v);
  }
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The signs of the transform's terms: bit j of kRhtSigns[kInverse][i] is set where term i of
// output j is subtracted: fp4::m_negative(i, j) for rht16, m_negative(j, i) for the inverse.
constexpr std::array<uint32_t, 16> rht_signs(bool inverse) {
  std::array<uint32_t, 16> m{};
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      if (inverse ? fp4::m_negative(j, i) : fp4::m_negative(i, j)) m[i] |= 1u << j;
    }
  }
  return m;
}
constexpr std::array<uint32_t, 16> kRhtSigns[2] = {rht_signs(false), rht_signs(true)};

// The same as sign words, the xor that negates a term: kRhtSignWords[kInverse][i][j] is
// 0x80000000 where term i of output j is subtracted, else 0.
struct RhtSignWords {
  alignas(64) uint32_t w[2][16][16];
};
constexpr RhtSignWords rht_sign_words() {
  RhtSignWords t{};
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) t.w[k][i][j] = ((kRhtSigns[k][i] >> j) & 1u) << 31;
    }
  }
  return t;
}
constexpr RhtSignWords kRhtSignWords = rht_sign_words();

// E2M1 magnitudes of codes 0-7 (e2m1_to_float), the table the decoding permutes.
constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// fp4::e2m1_rne's rounding thresholds in order: |v| passing one raises the magnitude code by
// one (> where the tie rounds down to the even code, >= where it rounds up); pass(t, predicate)
// is called for each, the predicate a _CMP_* constant.
template <typename Pass>
C10_ALWAYS_INLINE void for_e2m1_thresholds(const Pass& pass) {
  pass(0.25f, _CMP_GT_OQ);
  pass(0.75f, _CMP_GE_OQ);
  pass(1.25f, _CMP_GT_OQ);
  pass(1.75f, _CMP_GE_OQ);
  pass(2.5f, _CMP_GT_OQ);
  pass(3.5f, _CMP_GE_OQ);
  pass(5.0f, _CMP_GT_OQ);
}

#if defined(CPU_CAPABILITY_AVX512)
struct Block16 {
  __m512 v;
};

template <typename T>
inline Block16 load16(const T* p) {
  return {load_acc<T>(p)};
}

// out[j] = (sum over i = 0..15, in order, of x[i] with the sign bit flipped where bit j of
// signs[i] is set) * 0.25: fp4::rht16 (kInverse false) or rht16_inverse, each output a lane
// of its own running sum, the same additions in the same order.
template <bool kInverse>
inline Block16 rht(const Block16& x) {
  alignas(64) float xs[16];  // term i broadcast from memory (a load, not a lane permute)
  _mm512_store_ps(xs, x.v);
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i < 16; ++i) {
    const __m512 sign =
        _mm512_load_ps(reinterpret_cast<const float*>(kRhtSignWords.w[kInverse][i]));
    acc = _mm512_add_ps(acc, _mm512_xor_ps(_mm512_set1_ps(xs[i]), sign));
  }
  return {_mm512_mul_ps(acc, _mm512_set1_ps(0.25f))};
}

// acc = the maximum of acc and the blocks' fp8::abs_bits_skip_nan keys, lane by lane.
inline void max_keys(const Block16& b, __m512i& acc) {
  const __m512i k = _mm512_and_si512(_mm512_castps_si512(b.v), _mm512_set1_epi32(0x7FFFFFFF));
  acc = _mm512_mask_max_epu32(acc, _mm512_cmple_epu32_mask(k, _mm512_set1_epi32(0x7F800000)),
                              acc, k);
}
inline uint32_t max_key(const __m512i& acc) { return _mm512_reduce_max_epu32(acc); }

// m = max(|b|, m) lane by lane, NaN skipped (vmaxps returns its second operand for NaN).
inline void max_abs(const Block16& b, __m512& m) { m = _mm512_max_ps(_mm512_abs_ps(b.v), m); }
inline __m512 zero_max() { return _mm512_setzero_ps(); }

// fp4::e2m1_rne lane by lane: the count of the rounding thresholds |v| passes
// (for_e2m1_thresholds), the sign in bit 3, and 7 for NaN.
inline __m512i e2m1_codes(__m512 v) {
  const __m512 a = _mm512_abs_ps(v);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i m = _mm512_setzero_si512();
  auto pass = [&](float t, int pred) {
    m = _mm512_mask_add_epi32(m, _mm512_cmp_ps_mask(a, _mm512_set1_ps(t), pred), m, one);
  };
  for_e2m1_thresholds(pass);
  m = _mm512_or_si512(m, _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(v), 31), 3));
  return _mm512_mask_mov_epi32(m, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(7));
}

// fp4::e2m1_stochastic lane by lane with the draws r: |v| saturated at 6 lies between grid
// neighbours fl * step and (fl + 1) * step (step 0.5, 1 or 2; q = |v| / step exact); it rounds
// up where frac = q - fl > (r >> 8) * 2^-24. The magnitude, on the grid, is then coded as
// e2m1_codes codes it, with v's sign (NaN: v itself, 7).
inline __m512i e2m1_sr_codes(__m512 v, __m512i r) {
  const __m512 a = _mm512_min_ps(_mm512_abs_ps(v), _mm512_set1_ps(fp4::kE2M1Max));  // NaN: 6
  const __mmask16 lt2 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
  const __mmask16 lt4 = _mm512_cmp_ps_mask(a, _mm512_set1_ps(4.0f), _CMP_LT_OQ);
  const __m512 step = _mm512_mask_mov_ps(
      _mm512_mask_mov_ps(_mm512_set1_ps(2.0f), lt4, _mm512_set1_ps(1.0f)), lt2,
      _mm512_set1_ps(0.5f));
  const __m512 q = _mm512_div_ps(a, step);
  const __m512 fl = _mm512_roundscale_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)),
                                 _mm512_set1_ps(1.0f / 16777216.0f));
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(q, fl), u, _CMP_GT_OQ);
  const __m512 mag = _mm512_mul_ps(_mm512_mask_add_ps(fl, up, fl, _mm512_set1_ps(1.0f)), step);
  const __m512 x = _mm512_or_ps(mag, _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
  return e2m1_codes(_mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v));
}

// The block's codes of b * e, two per byte (code 2k in the low nibble of byte k), at d: rounded
// to nearest even, or stochastically with the 16 draws at r.
inline void store_codes(uint8_t* d, const Block16& b, float e, const uint32_t* r) {
  const __m512 v = _mm512_mul_ps(b.v, _mm512_set1_ps(e));
  const __m512i c = r == nullptr ? e2m1_codes(v) : e2m1_sr_codes(v, _mm512_loadu_si512(r));
  // per 64-bit pair: the odd lane's code (bits 32-35) moved to bits 4-7 of the even lane's
  const __m512i t = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(d), _mm512_cvtepi64_epi8(t));
}

// The 16 values e2m1_to_float(code) * s of the block's 8 bytes at d.
inline Block16 decode16(const uint8_t* d, float s) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(d));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  const __m512i code = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
  const __m512 mag = _mm512_permutexvar_ps(
      _mm512_and_si512(code, _mm512_set1_epi32(7)), _mm512_castps256_ps512(_mm256_loadu_ps(kE2M1)));
  const __m512 sign = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_srli_epi32(code, 3), 31));
  return {_mm512_mul_ps(_mm512_xor_ps(mag, sign), _mm512_set1_ps(s))};
}

template <typename T>
inline void store16(T* o, const Block16& b) {
  store_products<T, true>(o, b.v);
}

// Blocks of a row whose scales are computed together, their maxima side by side in one vector.
constexpr int kGroup = 16;
using Lanes = __m512;
inline Lanes group_max(Lanes m[kGroup]) { return max_lanes_16(m); }

// fp4::block_scale_e4m3 and block_encode_scale lane by lane (block maxima, never NaN): the E4M3
// scale codes, and the multipliers in e. vminps returns its second operand, FLT_MAX, for NaN.
inline __m512i block_scales(__m512 bamax, float s_enc, __m512& e) {
  const __m512 big = _mm512_set1_ps(fp8::kFltMax);
  const __m512 d = _mm512_min_ps(_mm512_mul_ps(bamax, _mm512_set1_ps(s_enc * fp4::kRcp6)), big);
  const __m512i code = fp8_codes<fp8::kE4M3>(d);
  const __m512 f = _mm512_i32gather_ps(code, fp8_values<fp8::kE4M3>().data(), 4);
  e = _mm512_min_ps(
      _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(f, _mm512_set1_ps(1.0f / s_enc))), big);
  return code;
}

inline void store_scale_bytes(uint8_t* p, __m512i code) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(code));
}
#else  // AVX2: a block is two vectors, lanes 0-7 and 8-15
struct Block16 {
  __m256 lo, hi;
};

template <typename T>
inline Block16 load16(const T* p) {
  return {load_acc<T>(p), load_acc<T>(p + 8)};
}

template <bool kInverse>
inline Block16 rht(const Block16& x) {  // as the AVX-512 rht
  alignas(32) float xs[16];
  _mm256_store_ps(xs, x.lo);
  _mm256_store_ps(xs + 8, x.hi);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int i = 0; i < 16; ++i) {
    const float* sign = reinterpret_cast<const float*>(kRhtSignWords.w[kInverse][i]);
    const __m256 xi = _mm256_set1_ps(xs[i]);
    lo = _mm256_add_ps(lo, _mm256_xor_ps(xi, _mm256_load_ps(sign)));
    hi = _mm256_add_ps(hi, _mm256_xor_ps(xi, _mm256_load_ps(sign + 8)));
  }
  const __m256 q = _mm256_set1_ps(0.25f);
  return {_mm256_mul_ps(lo, q), _mm256_mul_ps(hi, q)};
}

// The magnitude keys, every one below 2^31: a signed compare finds the NaN keys, zeroed.
inline void max_keys(const Block16& b, __m256i& acc) {
  const __m256i mag = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  for (__m256 v : {b.lo, b.hi}) {
    const __m256i k = _mm256_and_si256(_mm256_castps_si256(v), mag);
    acc = _mm256_max_epu32(acc, _mm256_andnot_si256(_mm256_cmpgt_epi32(k, inf), k));
  }
}
inline uint32_t max_key(const __m256i& acc) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  uint32_t m = 0;
  for (uint32_t v : lanes) m = v > m ? v : m;
  return m;
}

inline void max_abs(const Block16& b, __m256& m) {
  const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  m = _mm256_max_ps(_mm256_and_ps(b.lo, mag), m);
  m = _mm256_max_ps(_mm256_and_ps(b.hi, mag), m);
}
inline __m256 zero_max() { return _mm256_setzero_ps(); }

inline __m256i e2m1_codes(__m256 v) {  // as the AVX-512 e2m1_codes
  const __m256 a = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  __m256i m = _mm256_setzero_si256();
  auto pass = [&](float t, int pred) {  // a true compare is -1: subtracting it counts
    m = _mm256_sub_epi32(m, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(t), pred)));
  };
  for_e2m1_thresholds(pass);
  m = _mm256_or_si256(m, _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 31), 3));
  return _mm256_blendv_epi8(m, _mm256_set1_epi32(7),
                            _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

// 8 codes to 4 bytes: per 64-bit pair the odd lane's code moved beside the even lane's, then
// the pairs' low bytes gathered (the high half's shuffled to bytes 2-3, and or-ed in).
inline __m128i pack_codes8(__m256i c) {
  const __m256i t = _mm256_or_si256(c, _mm256_srli_epi64(c, 28));
  const __m256i g = _mm256_shuffle_epi8(
      t, _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                          0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  return _mm_or_si128(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
}

inline __m256i e2m1_sr_codes(__m256 v, __m256i r) {  // as the AVX-512 e2m1_sr_codes
  const __m256 a = _mm256_min_ps(
      _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))),
      _mm256_set1_ps(fp4::kE2M1Max));
  const __m256 step = _mm256_blendv_ps(
      _mm256_blendv_ps(_mm256_set1_ps(2.0f), _mm256_set1_ps(1.0f),
                       _mm256_cmp_ps(a, _mm256_set1_ps(4.0f), _CMP_LT_OQ)),
      _mm256_set1_ps(0.5f), _mm256_cmp_ps(a, _mm256_set1_ps(2.0f), _CMP_LT_OQ));
  const __m256 q = _mm256_div_ps(a, step);
  const __m256 fl = _mm256_round_ps(q, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(q, fl), u, _CMP_GT_OQ),
                                  _mm256_set1_ps(1.0f));
  const __m256 mag = _mm256_mul_ps(_mm256_add_ps(fl, up), step);
  const __m256 x = _mm256_or_ps(mag, _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
  return e2m1_codes(_mm256_blendv_ps(x, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

inline void store_codes(uint8_t* d, const Block16& b, float e, const uint32_t* r) {
  const __m256 ev = _mm256_set1_ps(e);
  auto codes = [&](__m256 v, int k) {
    v = _mm256_mul_ps(v, ev);
    if (r == nullptr) return pack_codes8(e2m1_codes(v));
    return pack_codes8(
        e2m1_sr_codes(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + k))));
  };
  _mm_storel_epi64(reinterpret_cast<__m128i*>(d),
                   _mm_unpacklo_epi32(codes(b.lo, 0), codes(b.hi, 8)));
}

inline Block16 decode16(const uint8_t* d, float s) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(d));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  const __m128i codes = _mm_unpacklo_epi8(lo, hi);
  const __m256 table = _mm256_loadu_ps(kE2M1);
  const __m256 sv = _mm256_set1_ps(s);
  auto values = [&](__m128i c8) {
    const __m256i c = _mm256_cvtepu8_epi32(c8);
    const __m256 mag = _mm256_permutevar8x32_ps(table, c);  // uses the index's low 3 bits
    const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(c, 3), 31));
    return _mm256_mul_ps(_mm256_xor_ps(mag, sign), sv);
  };
  return {values(codes), values(_mm_srli_si128(codes, 8))};
}

template <typename T>
inline void store16(T* o, const Block16& b) {
  store_products<T, true>(o, b.lo);
  store_products<T, true>(o + 8, b.hi);
}

constexpr int kGroup = 8;
using Lanes = __m256;
inline Lanes group_max(Lanes m[kGroup]) { return max_lanes_8(m); }

inline __m256i block_scales(__m256 bamax, float s_enc, __m256& e) {  // as the AVX-512 one
  const __m256 big = _mm256_set1_ps(fp8::kFltMax);
  const __m256 d = _mm256_min_ps(_mm256_mul_ps(bamax, _mm256_set1_ps(s_enc * fp4::kRcp6)), big);
  const __m256i code = fp8_codes<fp8::kE4M3>(d);
  const __m256 f = _mm256_i32gather_ps(fp8_values<fp8::kE4M3>().data(), code, 4);
  e = _mm256_min_ps(
      _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(f, _mm256_set1_ps(1.0f / s_enc))), big);
  return code;
}

inline void store_scale_bytes(uint8_t* p, __m256i code) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), lane_bytes8(code));
}
#endif

template <typename T>
inline Block16 load_block16(const T* p, bool rht_on) {
  const Block16 b = load16<T>(p);
  return rht_on ? rht<false>(b) : b;
}

// out[k] = the draw of element i0 + k, k < n (i0 a multiple of 4): groups of counters on
// vectors (philox_vec.h), the rest from an engine positioned at its first element.
inline void row_draws(uint64_t seed, int64_t i0, int64_t n, uint32_t* out) {
  constexpr int64_t kDraws = 4 * cpu::kPhiloxLanes;
  int64_t k = 0;
  for (; k + kDraws <= n; k += kDraws) {
    cpu::philox_draws(seed, static_cast<uint64_t>((i0 + k) / 4), out + k);
  }
  if (k < n) {
    at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(i0 + k));
    for (; k < n; ++k) out[k] = rng();
  }
}

// quantize (below) on Block16s.
template <typename T>
void quantize_vec(const Nvfp4QuantizeArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t R = a.rows, C = a.cols, nb = C / B;
  const bool rht_on = a.rht;
  std::vector<uint32_t> row_max(R, 0u);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
#if defined(CPU_CAPABILITY_AVX512)
      __m512i keys = _mm512_setzero_si512();
#else
      __m256i keys = _mm256_setzero_si256();
#endif
      for (int64_t b = 0; b < nb; ++b) max_keys(load_block16<T>(x + r * C + b * B, rht_on), keys);
      row_max[r] = max_key(keys);
    }
  });
  const uint32_t amax_bits = R ? *std::max_element(row_max.begin(), row_max.end()) : 0u;
  const float amax = fp8::float_of(amax_bits);
  *a.amax = amax;
  const float s_enc = fp4::global_encode_scale(amax);
  const int64_t h = a.block_2d ? B : 1;
  const int64_t groups = (R + h - 1) / h;
  const bool sr = a.seed != nullptr;
  const uint64_t seed = sr ? static_cast<uint64_t>(*a.seed) : 0u;
  at::parallel_for(0, groups, a.block_2d ? 1 : 16, [&](int64_t g0, int64_t g1) {
    Block16 v[B];
    std::vector<uint32_t> draws(sr ? h * C : 0);  // the group's rows' draws, element by element
    // the draws of block b of row r (r0 <= r < r0 + h), or nullptr: round to nearest even
    auto block_draws = [&](int64_t r0, int64_t r, int64_t b) -> const uint32_t* {
      return sr ? draws.data() + (r - r0) * C + b * B : nullptr;
    };
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * h, r1 = std::min(R, r0 + h);
      for (int64_t r = r0; sr && r < r1; ++r) {
        row_draws(seed, r * C, C, draws.data() + (r - r0) * C);
      }
      int64_t b = 0;
      if (h == 1) {  // 1-D blocks: kGroup of a row's blocks at a time, their scales lane by lane
        for (; b + kGroup <= nb; b += kGroup) {
          Lanes m[kGroup];
          for (int j = 0; j < kGroup; ++j) {
            v[j] = load_block16<T>(x + r0 * C + (b + j) * B, rht_on);
            m[j] = zero_max();
            max_abs(v[j], m[j]);
          }
          Lanes e;
          store_scale_bytes(a.scales + r0 * nb + b, block_scales(group_max(m), s_enc, e));
          alignas(64) float ev[kGroup];
          std::memcpy(ev, &e, sizeof(ev));
          for (int j = 0; j < kGroup; ++j) {
            store_codes(a.data + (r0 * C + (b + j) * B) / 2, v[j], ev[j],
                        block_draws(r0, r0, b + j));
          }
        }
      }
      for (; b < nb; ++b) {
        auto m = zero_max();
        for (int64_t r = r0; r < r1; ++r) {
          v[r - r0] = load_block16<T>(x + r * C + b * B, rht_on);
          max_abs(v[r - r0], m);
        }
        const uint8_t scale = fp4::block_scale_e4m3(max_lane(m), s_enc);
        const float e = fp4::block_encode_scale(scale, s_enc);
        for (int64_t r = r0; r < r1; ++r) {
          store_codes(a.data + (r * C + b * B) / 2, v[r - r0], e, block_draws(r0, r, b));
          a.scales[r * nb + b] = scale;
        }
      }
    }
  });
}
#endif

template <typename T>
void quantize(const Nvfp4QuantizeArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t R = a.rows, C = a.cols, nb = C / B;
  // pass 1: amax = max |v| as the integer maximum of the magnitude bits (NaN skipped)
  std::vector<uint32_t> row_max(R, 0u);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    float v[B];
    for (int64_t r = r0; r < r1; ++r) {
      uint32_t m = 0u;
      for (int64_t b = 0; b < nb; ++b) {
        load_block(x, C, r, b, a.rht, v);
        for (int64_t j = 0; j < B; ++j) m = std::max(m, fp8::abs_bits_skip_nan(v[j]));
      }
      row_max[r] = m;
    }
  });
  const uint32_t amax_bits = R ? *std::max_element(row_max.begin(), row_max.end()) : 0u;
  const float amax = fp8::float_of(amax_bits);
  *a.amax = amax;
  const float s_enc = fp4::global_encode_scale(amax);
  const bool sr = a.seed != nullptr;
  const uint64_t seed = sr ? static_cast<uint64_t>(*a.seed) : 0u;
  // pass 2: per group of h rows (16 for 2-D blocks) and block column b
  const int64_t h = a.block_2d ? B : 1;
  const int64_t groups = (R + h - 1) / h;
  at::parallel_for(0, groups, a.block_2d ? 1 : 16, [&](int64_t g0, int64_t g1) {
    float v[B * B];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * h, r1 = std::min(R, r0 + h);
      for (int64_t b = 0; b < nb; ++b) {
        float bamax = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          float* vr = v + (r - r0) * B;
          load_block(x, C, r, b, a.rht, vr);
          for (int64_t j = 0; j < B; ++j) bamax = std::fmax(bamax, std::fabs(vr[j]));
        }
        const uint8_t scale = fp4::block_scale_e4m3(bamax, s_enc);
        const float e = fp4::block_encode_scale(scale, s_enc);
        for (int64_t r = r0; r < r1; ++r) {
          const float* vr = v + (r - r0) * B;
          const int64_t i0 = r * C + b * B;
          uint8_t code[B];
          if (sr) {
            at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(i0));
            for (int64_t j = 0; j < B; ++j) code[j] = fp4::e2m1_stochastic(vr[j] * e, rng());
          } else {
            for (int64_t j = 0; j < B; ++j) code[j] = fp4::e2m1_rne(vr[j] * e);
          }
          uint8_t* d = a.data + i0 / 2;
          for (int64_t k = 0; k < B / 2; ++k) {
            d[k] = static_cast<uint8_t>(code[2 * k] | (code[2 * k + 1] << 4));
          }
          a.scales[r * nb + b] = scale;
        }
      }
    }
  });
}

void nvfp4_quantize_cpu(const Nvfp4QuantizeArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "nvfp4_quantize", [&] {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    quantize_vec<scalar_t>(a);
#else
    quantize<scalar_t>(a);
#endif
  });
}

void nvfp4_dequantize_cpu(const Nvfp4DequantizeArgs& a) {
  const int64_t R = a.rows, C = a.cols, nb = C / B;
  const float amax = *a.amax;
  TE_DISPATCH_FLOAT(a.out_dtype, "nvfp4_dequantize", [&] {
    using T = scalar_t;
    T* out = static_cast<T*>(a.out);
    at::parallel_for(0, R * nb, 256, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const float s = fp4::dequant_scale(a.scales[q], amax);
        const uint8_t* d = a.data + q * (B / 2);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
        // whole vectors where every value, and every sum of the inverse transform, is a
        // normal fp32 or zero (the values are multiples of s / 8, at most 24 s): the vector
        // stores round as the scalar casts
        const uint32_t sb = fp8::abs_bits(s);
        if constexpr (!std::is_same_v<T, double>) {
          if (sb >= (127u - 120u) << 23 && sb <= (127u + 100u) << 23) {
            const Block16 v = decode16(d, s);
            store16<T>(out + q * B, a.rht ? rht<true>(v) : v);
            continue;
          }
        }
#endif
        float v[B], w[B];
        for (int64_t k = 0; k < B / 2; ++k) {
          v[2 * k] = fp4::e2m1_to_float(d[k] & 0xF) * s;
          v[2 * k + 1] = fp4::e2m1_to_float(d[k] >> 4) * s;
        }
        const float* src = v;
        if (a.rht) {
          fp4::rht16_inverse(v, w);
          src = w;
        }
        T* o = out + q * B;
        for (int64_t j = 0; j < B; ++j) o[j] = static_cast<T>(src[j]);
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(nvfp4_quantize_stub, CPU, nvfp4_quantize_cpu);
TE_REGISTER_KERNEL(nvfp4_dequantize_stub, CPU, nvfp4_dequantize_cpu);

}  // namespace te_cpp
