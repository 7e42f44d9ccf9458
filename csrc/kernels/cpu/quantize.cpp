// CPU backend of the quantize family: FP8 per-tensor current / delayed scaling and MXFP8
// (the stubs of ops/quantize.h; the scalar rules are common/fp8.h's, shared with CUDA).
//
// The amax reduction runs over fixed blocks of kAmaxBlock elements (one private maximum per
// block, then the block maxima), so the result depends only on the shape. NaN elements are
// skipped (fp8::abs_bits_skip_nan: TransformerEngine's amax kernels reduce with fmaxf), so a
// NaN changes only its own code: the AVX512 and AVX2 paths take the maximum of the magnitude
// bit patterns of the non-NaN lanes, a build without either at::vec's maximum of |x| with NaN
// lanes zeroed (both only over a block whose plain maximum is NaN: the common case costs no
// extra pass).
// The AVX512 and AVX2 casts are vectorised and give the same bytes as the scalar
// fp8::cast_to_fp8.
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fp8_vec.h"
#include "kernels/cpu/vec.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

using fp8::kE4M3;
using fp8::kE5M2;

constexpr int64_t kAmaxBlock = 16384;

#if defined(CPU_CAPABILITY_AVX512)
// The maximum magnitude key of n elements (fp8::abs_bits, or for bf16 and fp16 their 16-bit
// magnitude; with kSkipNan fp8::abs_bits_skip_nan / abs_bits16_skip_nan lane by lane): with
// the sign bit cleared, the order of IEEE floats is the order of their bits as unsigned
// integers and every NaN is above +inf's pattern, so the integer maximum is the float maximum.
// kSkipNan leaves the NaN lanes out (a masked maximum). bf16 and fp16 are compared as 16-bit
// integers, 32 per vector, without a conversion to fp32.
template <typename T, bool kSkipNan>
uint32_t amax_key(const T* x, int64_t n, uint32_t inf_bits) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr int64_t L = k16 ? 32 : 16;  // elements per 512-bit vector
  const __m512i absmask = k16 ? _mm512_set1_epi16(0x7FFF) : _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i inf = k16 ? _mm512_set1_epi16(static_cast<int16_t>(inf_bits))
                          : _mm512_set1_epi32(static_cast<int>(inf_bits));
  // max(a, k); with kSkipNan only in the lanes where k is not NaN (k <= +inf's pattern)
  auto vmax = [&](__m512i a, __m512i k) {
    if constexpr (k16 && kSkipNan) {
      return _mm512_mask_max_epu16(a, _mm512_cmple_epu16_mask(k, inf), a, k);
    } else if constexpr (k16) {
      return _mm512_max_epu16(a, k);
    } else if constexpr (kSkipNan) {
      return _mm512_mask_max_epu32(a, _mm512_cmple_epu32_mask(k, inf), a, k);
    } else {
      return _mm512_max_epu32(a, k);
    }
  };
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  auto ld = [&](int64_t j) {
    return _mm512_and_si512(_mm512_loadu_si512(reinterpret_cast<const void*>(x + j)), absmask);
  };
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = vmax(a0, ld(i));
    a1 = vmax(a1, ld(i + L));
    a2 = vmax(a2, ld(i + 2 * L));
    a3 = vmax(a3, ld(i + 3 * L));
  }
  for (; i + L <= n; i += L) a0 = vmax(a0, ld(i));
  if (i < n) {  // zero-filled partial load
    const __m512i t =
        k16 ? _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << (n - i)) - 1), x + i)
            : _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << (n - i)) - 1), x + i);
    a0 = vmax(a0, _mm512_and_si512(t, absmask));
  }
  // the accumulators hold no NaN key with kSkipNan: a plain maximum merges them
  const __m512i a = k16 ? _mm512_max_epu16(_mm512_max_epu16(a0, a1), _mm512_max_epu16(a2, a3))
                        : _mm512_max_epu32(_mm512_max_epu32(a0, a1), _mm512_max_epu32(a2, a3));
  if constexpr (k16) {
    alignas(64) uint16_t lanes[32];
    _mm512_store_si512(reinterpret_cast<void*>(lanes), a);
    uint16_t m = 0;
    for (uint16_t v : lanes) m = v > m ? v : m;
    return m;
  } else {
    alignas(64) uint32_t lanes[16];
    _mm512_store_si512(reinterpret_cast<void*>(lanes), a);
    uint32_t m = 0;
    for (uint32_t v : lanes) m = v > m ? v : m;
    return m;
  }
}
#elif defined(CPU_CAPABILITY_AVX2)
// amax_key on 256-bit vectors (16 bf16 / fp16 or 8 fp32 keys each). Every key is below 2^31
// (below 2^15 for the 16-bit ones), so signed compares find the NaN keys; kSkipNan zeroes them
// before the maximum.
template <typename T, bool kSkipNan>
uint32_t amax_key(const T* x, int64_t n, uint32_t inf_bits) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr int64_t L = k16 ? 16 : 8;  // elements per 256-bit vector
  const __m256i absmask = k16 ? _mm256_set1_epi16(0x7FFF) : _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = k16 ? _mm256_set1_epi16(static_cast<int16_t>(inf_bits))
                          : _mm256_set1_epi32(static_cast<int>(inf_bits));
  auto vmax = [&](__m256i a, __m256i k) {
    if constexpr (kSkipNan) {
      k = _mm256_andnot_si256(k16 ? _mm256_cmpgt_epi16(k, inf) : _mm256_cmpgt_epi32(k, inf), k);
    }
    return k16 ? _mm256_max_epu16(a, k) : _mm256_max_epu32(a, k);
  };
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  auto ld = [&](const void* p) {
    return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), absmask);
  };
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = vmax(a0, ld(x + i));
    a1 = vmax(a1, ld(x + i + L));
    a2 = vmax(a2, ld(x + i + 2 * L));
    a3 = vmax(a3, ld(x + i + 3 * L));
  }
  for (; i + L <= n; i += L) a0 = vmax(a0, ld(x + i));
  if (i < n) {  // the rest in a zeroed vector-sized buffer
    alignas(32) T rest[L] = {};
    std::memcpy(rest, x + i, static_cast<size_t>(n - i) * sizeof(T));
    a0 = vmax(a0, ld(rest));
  }
  // the accumulators hold no NaN key with kSkipNan: a plain maximum merges them
  const __m256i a = k16 ? _mm256_max_epu16(_mm256_max_epu16(a0, a1), _mm256_max_epu16(a2, a3))
                        : _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
  using Key = std::conditional_t<k16, uint16_t, uint32_t>;
  alignas(32) Key lanes[L];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  uint32_t m = 0;
  for (Key v : lanes) m = v > m ? v : m;
  return m;
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// max |x[i]| over n elements, NaN skipped: the plain maximum key first (the masked one costs a
// compare per vector), and only when it is a NaN's, the NaN-skipping maximum over the elements
// again. Both are exact, so the result is the NaN-skipping maximum either way.
template <typename T>
float amax_bits(const T* x, int64_t n) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr uint32_t kInf =
      k16 ? fp8::kInfBits16<std::is_same_v<T, c10::BFloat16>> : fp8::kInfBits;
  uint32_t m = amax_key<T, false>(x, n, kInf);
  if (m > kInf) m = amax_key<T, true>(x, n, kInf);
  if constexpr (k16) {
    return static_cast<float>(T(static_cast<uint16_t>(m), T::from_bits()));
  } else {
    return c10::bit_cast<float>(m);
  }
}
#endif

template <typename T>
float amax_of(const T* x, int64_t n) {
  const int64_t nblocks = (n + kAmaxBlock - 1) / kAmaxBlock;
  std::vector<float> partial(std::max<int64_t>(nblocks, 1), 0.0f);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * kAmaxBlock;
      const int64_t i1 = std::min(n, i0 + kAmaxBlock);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      partial[b] = amax_bits<T>(x + i0, i1 - i0);
#else
      using V = at::vec::Vectorized<float>;
      constexpr int64_t W = V::size();
      // the maximum of |v| (at::vec::maximum propagates NaN) or, with skip, of |v| with the NaN
      // lanes zeroed (fp8::abs_bits_skip_nan as floats: v == v is false exactly for NaN, and
      // its all-ones lanes keep |v| in the bitwise and); four independent accumulators (the
      // maximum is exact and order-free, so this equals one accumulator)
      auto reduce = [&](auto skip) {  // skip: std::bool_constant
        auto mag = [](const V& v) {
          if constexpr (decltype(skip)::value) {
            return v.abs() & (v == v);
          } else {
            return v.abs();
          }
        };
        V a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
        int64_t i = i0;
        for (; i + 4 * W <= i1; i += 4 * W) {
          a0 = at::vec::maximum(a0, mag(load_acc<T>(x + i)));
          a1 = at::vec::maximum(a1, mag(load_acc<T>(x + i + W)));
          a2 = at::vec::maximum(a2, mag(load_acc<T>(x + i + 2 * W)));
          a3 = at::vec::maximum(a3, mag(load_acc<T>(x + i + 3 * W)));
        }
        for (; i + W <= i1; i += W) a0 = at::vec::maximum(a0, mag(load_acc<T>(x + i)));
        if (i < i1) a0 = at::vec::maximum(a0, mag(load_acc<T>(x + i, i1 - i)));  // zero-padded
        const V acc = at::vec::maximum(at::vec::maximum(a0, a1), at::vec::maximum(a2, a3));
        alignas(64) float lanes[W];
        acc.store(lanes);
        float m = 0.0f;
        for (int64_t k = 0; k < W; ++k) m = (std::isnan(lanes[k]) || lanes[k] > m) ? lanes[k] : m;
        return m;
      };
      // the plain maximum first; only a block holding a NaN is reduced again without them
      float m = reduce(std::false_type{});
      if (std::isnan(m)) m = reduce(std::true_type{});
      partial[b] = m;
#endif
    }
  });
  float amax = 0.0f;
  for (float p : partial) amax = p > amax ? p : amax;
  return amax;
}

// data[i] = cast_to_fp8(float(x[i]) * scale): one fp32 multiply, then the saturating RNE cast
// (cast_span), in parallel.
template <typename T, c10::ScalarType F>
void cast_scaled(const T* x, uint8_t* out, int64_t n, float scale) {
  at::parallel_for(0, n, kParallelGrainElems, [=](int64_t i0, int64_t i1) {
    cast_span<T, F>(x + i0, out + i0, i1 - i0, scale);
  });
}

void fp8_quantize_cpu(const Fp8QuantizeArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_quantize", [&] {
    using T = scalar_t;
    const T* xp = static_cast<const T*>(a.x);
    const float amax = amax_of<T>(xp, a.n);
    const float scale =
        a.scale != nullptr
            ? *a.scale
            : fp8::compute_scale(amax, fp8::max_norm(a.fp8_dtype), a.force_pow_2_scales,
                                 a.amax_epsilon);
    visit_format(a.fp8_dtype,
                 [&](auto F) { cast_scaled<T, decltype(F)::value>(xp, a.data, a.n, scale); });
    *a.scale_inv = fp8::scale_inv(scale);
    *a.amax = amax;
  });
}

// fp8_quantize's amax alone (amax_of: the same blocks, the same bits).
void fp8_amax_cpu(const Fp8AmaxArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_amax", [&] {
    *a.amax = amax_of<scalar_t>(static_cast<const scalar_t*>(a.x), a.n);
  });
}

void fp8_current_scale_cpu(const Fp8CurrentScaleArgs& a) {
  *a.scale = fp8::compute_scale(*a.amax, fp8::max_norm(a.fp8_dtype), a.force_pow_2_scales,
                                a.amax_epsilon);
}

// out[i] = T(fp8_to_float(data[i]) * s), the product in fp32 (dequantize_span: vectorised,
// the same bytes as the scalar expression): s = *scale_inv over the whole tensor, or MXFP8's
// e8m0_to_float(e8m0[b]) over block b of 32 elements.
void fp8_dequantize_cpu(const Fp8DequantizeArgs& a) {
  constexpr int64_t B = fp8::kMXFP8BlockSize;
  TE_DISPATCH_FLOAT(a.out_dtype, "fp8_dequantize", [&] {
    using T = scalar_t;
    T* op = static_cast<T*>(a.out);
    const uint8_t* dp = a.data;
    visit_format(a.fp8_dtype, [&](auto Fc) {
      constexpr c10::ScalarType F = decltype(Fc)::value;
      if (a.e8m0 == nullptr) {
        const float s = *a.scale_inv;
        at::parallel_for(0, a.n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
          dequantize_span<F, T>(dp + i0, op + i0, i1 - i0, s);
        });
        return;
      }
      const uint8_t* sp = a.e8m0;
      at::parallel_for(0, a.n / B, kParallelGrainElems / B, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          dequantize_span<F, T>(dp + b * B, op + b * B, B, fp8::e8m0_to_float(sp[b]));
        }
      });
    });
  });
}

#if defined(CPU_CAPABILITY_AVX512)
// fp8::float_to_e8m0(amax * max_norm_rcp) and fp8::e8m0_rcp of it lane by lane (16 block
// maxima, never NaN): the exponents in the 32-bit lanes, the multipliers in rcp.
inline __m512i mx_exponents(__m512 amax, float max_norm_rcp, __m512& rcp) {
  const __m512 val = _mm512_mul_ps(amax, _mm512_set1_ps(max_norm_rcp));
  const __m512i bits = _mm512_castps_si512(val);
  const __m512i exp = _mm512_srli_epi32(bits, 23);
  const __m512i mant = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFF));
  const __mmask16 up = _mm512_test_epi32_mask(mant, mant) &
                       _mm512_cmpneq_epi32_mask(exp, _mm512_set1_epi32(0xFE)) &
                       ~(_mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512()) &
                         _mm512_cmple_epi32_mask(mant, _mm512_set1_epi32(0x400000)));
  __m512i e = _mm512_mask_add_epi32(exp, up, exp, _mm512_set1_epi32(1));
  e = _mm512_mask_mov_epi32(e, _mm512_cmpeq_epi32_mask(exp, _mm512_set1_epi32(0xFF)),
                            _mm512_set1_epi32(0xFE));  // inf (NaN cannot occur)
  // 2^(127 - e) as bits (254 - e) << 23, and 1 for e == 0
  rcp = _mm512_mask_mov_ps(
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), e), 23)),
      _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_ps(1.0f));
  return e;
}

// 16 consecutive MXFP8 blocks (16 x 32 elements): the block maxima side by side in one
// vector, fp8::float_to_e8m0 and fp8::e8m0_rcp lane by lane (the value is never NaN here),
// then each block's data cast with its lane's multiplier.
template <typename T, c10::ScalarType F>
inline void mxfp8_16_blocks(const T* __restrict x, uint8_t* __restrict data,
                            uint8_t* __restrict scales, float max_norm_rcp) {
  constexpr int64_t W = 16;
  __m512 m[16];
  for (int j = 0; j < 16; ++j) {
    const __m512 v0 = load_acc<T>(x + j * 2 * W), v1 = load_acc<T>(x + j * 2 * W + W);
    // _mm512_max_ps(a, b) returns b when either is NaN: a NaN element is skipped (std::fmax)
    m[j] = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
  }
  __m512 rcp;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(scales),
                   _mm512_cvtepi32_epi8(mx_exponents(max_lanes_16(m), max_norm_rcp, rcp)));
  for (int j = 0; j < 16; j += 2) {  // two blocks (64 elements) per store
    const __m512 s0 = _mm512_permutexvar_ps(_mm512_set1_epi32(j), rcp);
    const __m512 s1 = _mm512_permutexvar_ps(_mm512_set1_epi32(j + 1), rcp);
    const T* xj = x + j * 2 * W;
    store_fp8_x4<F>(data + j * 2 * W, _mm512_mul_ps(load_acc<T>(xj), s0),
                    _mm512_mul_ps(load_acc<T>(xj + W), s0),
                    _mm512_mul_ps(load_acc<T>(xj + 2 * W), s1),
                    _mm512_mul_ps(load_acc<T>(xj + 3 * W), s1));
  }
}

// 16 consecutive MXFP8 blocks of bf16, worked on as 16-bit lanes: a block of 32 bf16 is one
// vector. A bf16 times a block multiplier 2^(127 - e) is the bf16 with its exponent moved, so
// the product needs no fp32 arithmetic: the FP8 code is the bf16 magnitude rounded to nearest
// even at the FP8 mantissa width (kDrop bits dropped, a carry moving into the exponent as in
// fp8_codes), plus the block's exponent offset, then saturated (min with the largest finite
// code), NaN made 0x7F, and the sign merged. The same bytes as mxfp8_16_blocks, which handles
// the rest: a group holding a block with e outside [bias, 253] (an inf or a very small block
// maximum), and each block holding an element other than zero whose scaled value is below
// FP8's normal range (an FP8 denormal: its rounding is not at a fixed bit).
template <c10::ScalarType F>
inline void mxfp8_16_blocks_bf16(const c10::BFloat16* __restrict x, uint8_t* __restrict data,
                                 uint8_t* __restrict scales) {
  constexpr int64_t B = 32;
  // E4M3: 3 mantissa bits of bf16's 7 kept, bias 7, largest finite code 0x7E.
  // E5M2: 2 kept, bias 15, largest finite code 0x7B.
  constexpr int kDrop = F == fp8::kE4M3 ? 4 : 5;
  constexpr int kBias = F == fp8::kE4M3 ? 7 : 15;
  constexpr int16_t kMaxCode = F == fp8::kE4M3 ? 0x7E : 0x7B;
  __m512 m[16];
  for (int j = 0; j < 16; ++j) {
    // the even elements' magnitudes as fp32 (shifted up), the odd ones' (masked): bf16 is the
    // upper half of an fp32, so these are exact; NaN skipped as in mxfp8_16_blocks
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(x + j * B));
    const __m512 even = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(v, 16), _mm512_set1_epi32(0x7FFFFFFF)));
    const __m512 odd =
        _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x7FFF0000)));
    m[j] = _mm512_max_ps(odd, _mm512_max_ps(even, _mm512_setzero_ps()));
  }
  __m512 rcp;
  const __m512i e = mx_exponents(max_lanes_16(m), fp8::max_norm_rcp<F>(), rcp);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(scales), _mm512_cvtepi32_epi8(e));
  // every multiplier 2^(127 - e) a normal fp32 (e <= 253) that does not raise a zero's code
  // above 0 (e >= kBias, below which the block maximum is under 2^-120); else the fp32 path
  if (_mm512_cmplt_epu32_mask(_mm512_sub_epi32(e, _mm512_set1_epi32(kBias)),
                              _mm512_set1_epi32(254 - kBias)) != 0xFFFF) {
    mxfp8_16_blocks<c10::BFloat16, F>(x, data, scales, fp8::max_norm_rcp<F>());
    return;
  }
  const __m512i mag_mask = _mm512_set1_epi16(0x7FFF);
  const __m512i round_half = _mm512_set1_epi16((1 << (kDrop - 1)) - 1);
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i zero = _mm512_setzero_si512();
  for (int j = 0; j < 16; ++j) {
    const int ej = scales[j];
    // the scaled value's FP8 biased exponent is E - ej + kBias for a bf16 exponent E, normal
    // for E >= ej - kBias + 1: below that magnitude (and above zero) the fp32 path
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(x + j * B));
    const __m512i mag = _mm512_and_si512(v, mag_mask);
    const __mmask32 low = _mm512_cmplt_epu16_mask(
        mag, _mm512_set1_epi16(static_cast<int16_t>((ej - kBias + 1) << 7)));
    if (_mm512_mask_cmpneq_epu16_mask(low, mag, zero) != 0) {
      const __m512 s = _mm512_set1_ps(fp8::e8m0_rcp(static_cast<uint8_t>(ej)));
      const c10::BFloat16* xj = x + j * B;
      store_fp8<F>(data + j * B, _mm512_mul_ps(load_acc<c10::BFloat16>(xj), s));
      store_fp8<F>(data + j * B + 16, _mm512_mul_ps(load_acc<c10::BFloat16>(xj + 16), s));
      continue;
    }
    // round to nearest even at bit kDrop: (mag + half - 1 + odd) >> kDrop, odd the kept LSB
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi16(mag, kDrop), one);
    __m512i c = _mm512_srli_epi16(_mm512_add_epi16(_mm512_add_epi16(mag, round_half), odd),
                                  kDrop);
    // exponent rebias: (kBias - ej) << mantissa bits (7 - kDrop), at most 0; zeros clamp to
    // 0; inf and the values past the largest finite code saturate
    c = _mm512_add_epi16(c, _mm512_set1_epi16(static_cast<int16_t>((kBias - ej)
                                                                  << (7 - kDrop))));
    c = _mm512_min_epi16(_mm512_max_epi16(c, zero), _mm512_set1_epi16(kMaxCode));
    c = _mm512_mask_mov_epi16(c, _mm512_cmpgt_epu16_mask(mag, _mm512_set1_epi16(0x7F80)),
                              _mm512_set1_epi16(0x7F));  // NaN
    // c | ((v >> 8) & 0x80): the sign bit into bit 7
    c = _mm512_ternarylogic_epi32(c, _mm512_srli_epi16(v, 8), _mm512_set1_epi16(0x80), 0xF8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(data + j * B), _mm512_cvtepi16_epi8(c));
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// mx_exponents on 8 lanes (8 block maxima, never NaN): the exponents in the 32-bit lanes,
// the multipliers in rcp. Every compared value is below 2^31, so signed compares serve.
inline __m256i mx_exponents(__m256 amax, float max_norm_rcp, __m256& rcp) {
  const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(amax, _mm256_set1_ps(max_norm_rcp)));
  const __m256i exp = _mm256_srli_epi32(bits, 23);
  const __m256i mant = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFF));
  const __m256i zero = _mm256_setzero_si256();
  // no rounding up: an exact power of two, the top exponent, or a subnormal <= 2^-127
  const __m256i keep = _mm256_or_si256(
      _mm256_or_si256(_mm256_cmpeq_epi32(mant, zero),
                      _mm256_cmpeq_epi32(exp, _mm256_set1_epi32(0xFE))),
      _mm256_andnot_si256(_mm256_cmpgt_epi32(mant, _mm256_set1_epi32(0x400000)),
                          _mm256_cmpeq_epi32(exp, zero)));
  __m256i e = _mm256_add_epi32(exp, _mm256_andnot_si256(keep, _mm256_set1_epi32(1)));
  e = _mm256_blendv_epi8(e, _mm256_set1_epi32(0xFE),
                         _mm256_cmpeq_epi32(exp, _mm256_set1_epi32(0xFF)));  // inf
  rcp = _mm256_blendv_ps(
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(254), e), 23)),
      _mm256_set1_ps(1.0f), _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, zero)));
  return e;
}

// 8 consecutive MXFP8 blocks (8 x 32 elements), mxfp8_16_blocks on 8 lanes: the block maxima
// side by side in one vector, the exponents and multipliers lane by lane, then each block's
// data cast with its lane's multiplier (its four vectors loaded again, from L1).
template <typename T, c10::ScalarType F>
inline void mxfp8_8_blocks(const T* __restrict x, uint8_t* __restrict data,
                           uint8_t* __restrict scales) {
  constexpr int64_t W = 8;
  __m256 m[8];
  for (int j = 0; j < 8; ++j) {
    at::vec::Vectorized<float> acc(0.0f);
    amax_span_into<T>(x + 4 * j * W, 4 * W, acc);
    m[j] = acc;
  }
  __m256 rcp;
  const __m256i e = mx_exponents(max_lanes_8(m), fp8::max_norm_rcp<F>(), rcp);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(scales), lane_bytes8(e));
  for (int j = 0; j < 8; ++j) {
    const __m256 s = _mm256_permutevar8x32_ps(rcp, _mm256_set1_epi32(j));
    const T* xj = x + 4 * j * W;
    store_fp8_x4<F>(data + 4 * j * W, _mm256_mul_ps(load_acc<T>(xj), s),
                    _mm256_mul_ps(load_acc<T>(xj + W), s),
                    _mm256_mul_ps(load_acc<T>(xj + 2 * W), s),
                    _mm256_mul_ps(load_acc<T>(xj + 3 * W), s));
  }
}

// 8 consecutive MXFP8 blocks of bf16 on 16-bit lanes: mxfp8_16_blocks_bf16 on AVX2, a block as
// two vectors of 16 (the same bytes; mxfp8_8_blocks takes the group, or the block, it leaves).
// Every 16-bit value compared is a magnitude or a code, below 2^15, so signed compares serve.
template <c10::ScalarType F>
inline void mxfp8_8_blocks_bf16(const c10::BFloat16* __restrict x, uint8_t* __restrict data,
                                uint8_t* __restrict scales) {
  constexpr int64_t B = 32;
  constexpr int kDrop = F == fp8::kE4M3 ? 4 : 5;
  constexpr int kBias = F == fp8::kE4M3 ? 7 : 15;
  constexpr int16_t kMaxCode = F == fp8::kE4M3 ? 0x7E : 0x7B;
  auto load = [&](int64_t i) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
  };
  __m256 m[8];
  for (int j = 0; j < 8; ++j) {
    // the even elements' magnitudes as fp32 (shifted up), the odd ones' (masked); NaN skipped
    // as in mxfp8_8_blocks
    __m256 acc = _mm256_setzero_ps();
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load(j * B + 16 * h);
      const __m256 even = _mm256_castsi256_ps(
          _mm256_and_si256(_mm256_slli_epi32(v, 16), _mm256_set1_epi32(0x7FFFFFFF)));
      const __m256 odd =
          _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFF0000)));
      acc = _mm256_max_ps(odd, _mm256_max_ps(even, acc));
    }
    m[j] = acc;
  }
  __m256 rcp;
  const __m256i e = mx_exponents(max_lanes_8(m), fp8::max_norm_rcp<F>(), rcp);
  // every e in [kBias, 253] (mxfp8_16_blocks_bf16), else the fp32 path for the group
  const __m256i out_of_range =
      _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(kBias), e),
                      _mm256_cmpgt_epi32(e, _mm256_set1_epi32(253)));
  if (!_mm256_testz_si256(out_of_range, out_of_range)) {
    mxfp8_8_blocks<c10::BFloat16, F>(x, data, scales);
    return;
  }
  alignas(32) int32_t es[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(es), e);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(scales), lane_bytes8(e));
  const __m256i mag_mask = _mm256_set1_epi16(0x7FFF);
  const __m256i round_half = _mm256_set1_epi16((1 << (kDrop - 1)) - 1);
  const __m256i one = _mm256_set1_epi16(1);
  const __m256i zero = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const int ej = es[j];
    const __m256i v0 = load(j * B), v1 = load(j * B + 16);
    const __m256i mag0 = _mm256_and_si256(v0, mag_mask), mag1 = _mm256_and_si256(v1, mag_mask);
    // an element other than zero below FP8's normal range after scaling: the fp32 path
    const __m256i normal = _mm256_set1_epi16(static_cast<int16_t>((ej - kBias + 1) << 7));
    const __m256i low = _mm256_or_si256(
        _mm256_andnot_si256(_mm256_cmpeq_epi16(mag0, zero), _mm256_cmpgt_epi16(normal, mag0)),
        _mm256_andnot_si256(_mm256_cmpeq_epi16(mag1, zero), _mm256_cmpgt_epi16(normal, mag1)));
    if (!_mm256_testz_si256(low, low)) {
      const __m256 s = _mm256_set1_ps(fp8::e8m0_rcp(static_cast<uint8_t>(ej)));
      const c10::BFloat16* xj = x + j * B;
      store_fp8_x4<F>(data + j * B, _mm256_mul_ps(load_acc<c10::BFloat16>(xj), s),
                      _mm256_mul_ps(load_acc<c10::BFloat16>(xj + 8), s),
                      _mm256_mul_ps(load_acc<c10::BFloat16>(xj + 16), s),
                      _mm256_mul_ps(load_acc<c10::BFloat16>(xj + 24), s));
      continue;
    }
    const __m256i offset = _mm256_set1_epi16(static_cast<int16_t>((kBias - ej) << (7 - kDrop)));
    auto codes = [&](__m256i v, __m256i mag) {
      // mxfp8_16_blocks_bf16's steps; the sum may pass 0x7FFF, which the logical shift takes
      // as unsigned
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(mag, kDrop), one);
      __m256i c = _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(mag, round_half), odd),
                                    kDrop);
      c = _mm256_add_epi16(c, offset);
      c = _mm256_min_epi16(_mm256_max_epi16(c, zero), _mm256_set1_epi16(kMaxCode));
      c = _mm256_blendv_epi8(c, _mm256_set1_epi16(0x7F),
                             _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(0x7F80)));  // NaN
      return _mm256_or_si256(
          c, _mm256_and_si256(_mm256_srli_epi16(v, 8), _mm256_set1_epi16(0x80)));
    };
    // the pack leaves each half's elements 0-7 then the other's per 128-bit lane
    const __m256i p = _mm256_packus_epi16(codes(v0, mag0), codes(v1, mag1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(data + j * B),
                        _mm256_permute4x64_epi64(p, 0xD8));
  }
}
#endif

// One MXFP8 block of 32 elements: the NaN-skipping amax (amax_span_into), its
// fp8::mxfp8_block_exponent, and the cast with its multiplier (cast_span).
template <typename T, c10::ScalarType F>
inline void mxfp8_block(const T* xb, uint8_t* db, uint8_t* sb) {
  constexpr int64_t B = fp8::kMXFP8BlockSize;
  at::vec::Vectorized<float> acc(0.0f);
  amax_span_into<T>(xb, B, acc);
  const uint8_t e = fp8::mxfp8_block_exponent<F>(max_lane(acc));
  *sb = e;
  cast_span<T, F>(xb, db, B, fp8::e8m0_rcp(e));
}

// MXFP8 (TE quantize_mxfp8.cuh, rowwise): per block of 32 consecutive elements of the last
// dim, amax = max |x| ignoring NaN (fmaxf); e = float_to_e8m0(amax * float(1/fp8_max));
// data = cast_to_fp8(x * e8m0_rcp(e)). Groups of 16 (AVX512) or 8 (AVX2) blocks, then one
// block at a time.
template <typename T, c10::ScalarType F>
void mxfp8_quantize_blocks(const T* x, uint8_t* data, uint8_t* scales, int64_t nblocks) {
  constexpr int64_t B = fp8::kMXFP8BlockSize;
  at::parallel_for(0, nblocks, std::max<int64_t>(1, kParallelGrainElems / B),
                   [=](int64_t b0, int64_t b1) {
    int64_t b = b0;
#if defined(CPU_CAPABILITY_AVX512)
    for (; b + 16 <= b1; b += 16) {
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        mxfp8_16_blocks_bf16<F>(x + b * B, data + b * B, scales + b);
      } else {
        mxfp8_16_blocks<T, F>(x + b * B, data + b * B, scales + b, fp8::max_norm_rcp<F>());
      }
    }
#elif defined(CPU_CAPABILITY_AVX2)
    for (; b + 8 <= b1; b += 8) {
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        mxfp8_8_blocks_bf16<F>(x + b * B, data + b * B, scales + b);
      } else {
        mxfp8_8_blocks<T, F>(x + b * B, data + b * B, scales + b);
      }
    }
#endif
    for (; b < b1; ++b) mxfp8_block<T, F>(x + b * B, data + b * B, scales + b);
  });
}

#if defined(CPU_CAPABILITY_AVX512)
// The 16 x 16 transpose of 32-bit elements held one row per register (d[i] = row i): d[j]
// becomes column j. Interleaves of dwords, then of qwords, leave 4 x 4 transposed blocks in
// each 128-bit lane; two rounds of 128-bit lane shuffles put the blocks in place.
inline void transpose_16x16_epi32(__m512i (&d)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(d[i], d[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(d[i], d[i + 1]);
  }
  // u[4i + m], lane L: rows 4i..4i+3 of column 4L + m
  __m512i u[16];
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
    d[m] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    d[4 + m] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    d[8 + m] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    d[12 + m] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// The columnwise copy of one tile, 32 kBlocks rows x 16 columns of the row-major x (row
// stride ld): column j's block maximum is lane j of the running maximum of a block's 32 rows
// (NaN skipped as in mxfp8_16_blocks), so the 16 scales need no reduction across lanes. Each
// row's codes (one per 32-bit lane, 0..255) are merged four rows at a time into the bytes of
// each lane, so that lane j holds column j's next 4 output bytes; a 16 x 16 dword transpose
// then gives each of the 16 output rows (out_ld apart) its 32 kBlocks bytes in one register
// (with two blocks, a whole cache line), the scales written scale_ld apart.
constexpr int64_t kTileCols = 16;
template <typename T, c10::ScalarType F, int kBlocks>
inline void mxfp8_tile(const T* __restrict x, int64_t ld, uint8_t* __restrict data,
                       int64_t out_ld, uint8_t* __restrict scales, int64_t scale_ld) {
  // The rows are a page or more apart, which the hardware prefetchers do not follow: the next
  // tile down (the pass's next one) is prefetched here.
  __m512 v[32 * kBlocks];
  __m512 rcp[kBlocks];
  for (int blk = 0; blk < kBlocks; ++blk) {
    __m512 m = _mm512_setzero_ps();
    for (int r = 32 * blk; r < 32 * blk + 32; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(x + (r + 32 * kBlocks) * ld), _MM_HINT_T0);
      v[r] = load_acc<T>(x + r * ld);
      m = _mm512_max_ps(_mm512_abs_ps(v[r]), m);
    }
    alignas(16) uint8_t e[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(e),
                    _mm512_cvtepi32_epi8(mx_exponents(m, fp8::max_norm_rcp<F>(), rcp[blk])));
    for (int j = 0; j < 16; ++j) scales[j * scale_ld + blk] = e[j];
  }
  __m512i d[16];
  for (int i = 0; i < 8 * kBlocks; ++i) {  // rows 4i..4i+3 as bytes 0..3 of each lane
    const __m512 s = rcp[i / 8];
    const __m512i c0 = fp8_codes<F>(_mm512_mul_ps(v[4 * i], s));
    const __m512i c1 = fp8_codes<F>(_mm512_mul_ps(v[4 * i + 1], s));
    const __m512i c2 = fp8_codes<F>(_mm512_mul_ps(v[4 * i + 2], s));
    const __m512i c3 = fp8_codes<F>(_mm512_mul_ps(v[4 * i + 3], s));
    d[i] = _mm512_or_si512(
        _mm512_ternarylogic_epi32(c0, _mm512_slli_epi32(c1, 8), _mm512_slli_epi32(c2, 16), 0xFE),
        _mm512_slli_epi32(c3, 24));
  }
  for (int i = 8 * kBlocks; i < 16; ++i) d[i] = _mm512_setzero_si512();
  transpose_16x16_epi32(d);
  for (int j = 0; j < 16; ++j) {
    if constexpr (kBlocks == 2) {
      _mm512_storeu_si512(reinterpret_cast<void*>(data + j * out_ld), d[j]);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(data + j * out_ld),
                          _mm512_castsi512_si256(d[j]));
    }
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// The 8 x 8 transpose of 32-bit elements held one row per register (d[i] = row i): d[j]
// becomes column j (interleaves of dwords and qwords, then of 128-bit halves).
inline void transpose_8x8_epi32(__m256i* d) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(d[i], d[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(d[i], d[i + 1]);
  }
  // u[4i + m], half h: rows 4i..4i+3 of column 4h + m
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    d[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    d[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// The AVX512 mxfp8_tile on 8 columns (one 256-bit vector per row): column j's block maximum is
// lane j of the running maximum of a block's 32 rows; four rows' codes at a time merged into
// the bytes of each lane, and an 8 x 8 dword transpose per 32 rows gives each of the 8 output
// rows its next 32 bytes.
constexpr int64_t kTileCols = 8;
template <typename T, c10::ScalarType F, int kBlocks>
inline void mxfp8_tile(const T* __restrict x, int64_t ld, uint8_t* __restrict data,
                       int64_t out_ld, uint8_t* __restrict scales, int64_t scale_ld) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[32 * kBlocks];
  __m256 rcp[kBlocks];
  for (int blk = 0; blk < kBlocks; ++blk) {
    __m256 m = _mm256_setzero_ps();
    for (int r = 32 * blk; r < 32 * blk + 32; ++r) {
      // as the AVX512 tile: the next tile down prefetched
      _mm_prefetch(reinterpret_cast<const char*>(x + (r + 32 * kBlocks) * ld), _MM_HINT_T0);
      v[r] = load_acc<T>(x + r * ld);
      // NaN skipped: vmaxps returns its second operand when either is NaN
      m = _mm256_max_ps(_mm256_and_ps(v[r], abs_mask), m);
    }
    alignas(32) int32_t e[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(e),
                       mx_exponents(m, fp8::max_norm_rcp<F>(), rcp[blk]));
    for (int j = 0; j < 8; ++j) scales[j * scale_ld + blk] = static_cast<uint8_t>(e[j]);
  }
  for (int blk = 0; blk < kBlocks; ++blk) {
    __m256i d[8];
    for (int i = 0; i < 8; ++i) {  // rows 4i..4i+3 of the block as bytes 0..3 of each lane
      const __m256* vi = v + 32 * blk + 4 * i;
      const __m256i c0 = fp8_codes<F>(_mm256_mul_ps(vi[0], rcp[blk]));
      const __m256i c1 = fp8_codes<F>(_mm256_mul_ps(vi[1], rcp[blk]));
      const __m256i c2 = fp8_codes<F>(_mm256_mul_ps(vi[2], rcp[blk]));
      const __m256i c3 = fp8_codes<F>(_mm256_mul_ps(vi[3], rcp[blk]));
      d[i] = _mm256_or_si256(_mm256_or_si256(c0, _mm256_slli_epi32(c1, 8)),
                             _mm256_or_si256(_mm256_slli_epi32(c2, 16),
                                             _mm256_slli_epi32(c3, 24)));
    }
    transpose_8x8_epi32(d);
    for (int j = 0; j < 8; ++j) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(data + j * out_ld + 32 * blk), d[j]);
    }
  }
}
#endif

// mxfp8_quantize_blocks of the transpose of the row-major [rows, cols] x (rows % 32 == 0)
// without materialising it: out row c (rows elements) holds column c of x, quantized in blocks
// of 32 rows, its scales at scales[c * rows / 32 ...]. One band of 32 rows per task unit. A
// task's bands are taken kPassBands at a time, and each such pass walks down its rows in tiles
// of 16 columns (AVX512) or 8 (AVX2) by two bands, column tile after column tile: every output
// row then receives 32 kPassBands consecutive bytes in one go, instead of 64 bytes at a time
// from output rows a page or more apart, and the pass's input rows stay in the caches and the
// TLB for the next column tile. The columns left over (every column without SIMD) gather their
// 32 elements per block and take the scalar block.
constexpr int64_t kPassBands = 16;

template <typename T, c10::ScalarType F>
void mxfp8_quantize_transposed(const T* x, int64_t rows, int64_t cols, uint8_t* data,
                               uint8_t* scales) {
  constexpr int64_t B = fp8::kMXFP8BlockSize;
  const int64_t nbands = rows / B;
  at::parallel_for(0, nbands, std::max<int64_t>(1, kParallelGrainElems / (B * cols)),
                   [=](int64_t b0, int64_t b1) {
    for (int64_t s0 = b0; s0 < b1; s0 += kPassBands) {
      const int64_t s1 = std::min(s0 + kPassBands, b1);
      int64_t c = 0;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      for (; c + kTileCols <= cols; c += kTileCols) {
        for (int64_t band = s0; band < s1;) {
          const int64_t nb = band + 2 <= s1 ? 2 : 1;  // two bands (64 rows) at a time
          const T* xb = x + band * B * cols + c;
          uint8_t* dc = data + c * rows + band * B;
          uint8_t* sc = scales + c * nbands + band;
          if (nb == 2) {
            mxfp8_tile<T, F, 2>(xb, cols, dc, rows, sc, nbands);
          } else {
            mxfp8_tile<T, F, 1>(xb, cols, dc, rows, sc, nbands);
          }
          band += nb;
        }
      }
#endif
      for (; c < cols; ++c) {
        for (int64_t band = s0; band < s1; ++band) {
          T col[B];
          for (int64_t r = 0; r < B; ++r) col[r] = x[(band * B + r) * cols + c];
          mxfp8_block<T, F>(col, data + c * rows + band * B, scales + c * nbands + band);
        }
      }
    }
  });
}

void mxfp8_quantize_cpu(const Mxfp8QuantizeArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "mxfp8_quantize", [&] {
    using T = scalar_t;
    visit_format(a.fp8_dtype, [&](auto F) {
      if (a.transposed_rows > 0) {
        mxfp8_quantize_transposed<T, decltype(F)::value>(
            static_cast<const T*>(a.x), a.transposed_rows,
            a.nblocks * fp8::kMXFP8BlockSize / a.transposed_rows, a.data, a.scales);
      } else {
        mxfp8_quantize_blocks<T, decltype(F)::value>(static_cast<const T*>(a.x), a.data,
                                                      a.scales, a.nblocks);
      }
    });
  });
}

// One column at a time (a few quantizers, histories of up to a few thousand rows): the amax in
// row order, then the roll in place.
void delayed_scaling_update_cpu(const DelayedScalingUpdateArgs& a) {
  const int64_t L = a.length, n = a.columns;
  for (int64_t j = 0; j < n; ++j) {
    float* h = a.history + j;
    const float first = h[0];
    float amax = first;
    if (!a.most_recent) {
      for (int64_t i = 1; i < L; ++i) amax = fp8::history_max(amax, h[i * n]);
    }
    for (int64_t i = 0; i + 1 < L; ++i) h[i * n] = h[(i + 1) * n];
    h[(L - 1) * n] = first;
    h[0] = 0.0f;
    a.scale[j] = fp8::delayed_scale(amax, a.scale[j], a.fp8_max, a.margin_div);
  }
}

}  // namespace

TE_REGISTER_KERNEL(delayed_scaling_update_stub, CPU, delayed_scaling_update_cpu);
TE_REGISTER_KERNEL(fp8_quantize_stub, CPU, fp8_quantize_cpu);
TE_REGISTER_KERNEL(fp8_amax_stub, CPU, fp8_amax_cpu);
TE_REGISTER_KERNEL(fp8_current_scale_stub, CPU, fp8_current_scale_cpu);
TE_REGISTER_KERNEL(fp8_dequantize_stub, CPU, fp8_dequantize_cpu);
TE_REGISTER_KERNEL(mxfp8_quantize_stub, CPU, mxfp8_quantize_cpu);

}  // namespace te_cpp
