// at::vec helpers: load any supported scalar type as fp32 (fp64 stays fp64) vectors, with
// partial loads for row tails, so kernels are written once over `Vectorized<acc_t>`.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace te_cpp {

// Accumulation type: double for double, float for float / bf16 / fp16.
template <typename T>
using acc_t = at::opmath_type<T>;

template <typename T>
using AccVec = at::vec::Vectorized<acc_t<T>>;

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)
using HalfBits = __m256i;  // the 16-bit patterns of one AccVec's lanes
#else
using HalfBits = __m128i;
#endif

#if defined(CPU_CAPABILITY_AVX2)
// v rounded to bf16 in the upper 16 bits of each 32-bit lane (the lower bits are left over):
// c10's round to nearest even, u + 0x7FFF + ((u >> 16) & 1), with NaN lanes all ones, so that
// the upper half is at::vec::cvtfp32_bf16's 0xFFFF. No finite u overflows the sum.
C10_ALWAYS_INLINE __m256i bf16_rounded_lanes(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
  return _mm256_or_si256(r, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
#endif

// v rounded to T (bf16 / fp16, round to nearest even), as 16-bit patterns. With AVX512_BF16,
// bf16 takes one vcvtneps2bf16 (NaN stays NaN; fp32 denormals, below 1.2e-38, become zero); with
// AVX2, the upper halves of bf16_rounded_lanes gathered by one byte shuffle and one permute (the
// bits of at::vec::cvtfp32_bf16, which shifts, packs and permutes).
template <typename T>
C10_ALWAYS_INLINE HalfBits half_bits(const AccVec<T>& v) {
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
#endif
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
#if defined(CPU_CAPABILITY_AVX2)
    // per 128-bit half: bytes 2-3, 6-7, 10-11, 14-15 to the low 8 bytes
    const __m256i upper = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1,
                                           -1, -1, 2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1,
                                           -1, -1, -1, -1);
    const __m256i h = _mm256_shuffle_epi8(bf16_rounded_lanes(v), upper);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08));
#else
    return at::vec::cvtfp32_bf16(v);
#endif
  } else {
    return at::vec::cvtfp32_fp16(v);
  }
}

// The fp32 values of T patterns (exact: bf16, the bits shifted up; fp16, vcvtph2ps). bf16 takes
// one shuffle that moves pattern i to the upper half of lane i and zeroes the lower halves,
// instead of a zero-extension and a shift: with AVX-512 a vpermw, with AVX2 a vpshufb of the
// patterns copied to both 128-bit halves (a vbroadcasti128, a plain load, where they come
// from memory).
template <typename T>
C10_ALWAYS_INLINE AccVec<T> widen_bits(const HalfBits& h) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m512i upper = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                           7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    return _mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, upper, _mm512_castsi256_si512(h)));
  } else {
    return _mm512_cvtph_ps(h);
  }
#else
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i upper = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                           -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1,
                                           14, 15);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), upper));
  } else {
    return _mm256_cvtph_ps(h);
  }
#endif
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The 16-bit patterns of the first n (<= a vector) bf16 / fp16 elements at p, zeros past them:
// a whole load, or one 16-bit masked load (AVX512) or a copy into a zeroed register-sized
// buffer (AVX2).
template <typename T>
C10_ALWAYS_INLINE HalfBits load_bits(const T* p, int64_t n) {
  constexpr int64_t kLanes = AccVec<T>::size();
#if defined(CPU_CAPABILITY_AVX512)
  return n == kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                     : _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p);
#else
  if (n == kLanes) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) uint16_t bits[kLanes] = {};
  std::memcpy(bits, p, static_cast<size_t>(n) * sizeof(T));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(bits));
#endif
}
#endif

// Load `n` (<= AccVec::size()) elements starting at p, converted to the accumulation type (exact),
// zeros past them.
template <typename T>
inline AccVec<T> load_acc(const T* p, int64_t n = AccVec<T>::size()) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    return n == AccVec<T>::size() ? AccVec<T>::loadu(p) : AccVec<T>::loadu(p, n);
  } else {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    return widen_bits<T>(load_bits(p, n));
#else
    if (n == AccVec<T>::size()) {
      AccVec<T> out;
      at::vec::load_to_float<T>(p, out);  // vectorised bf16/fp16 -> fp32
      return out;
    }
    alignas(64) A buf[AccVec<T>::size()] = {};
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<A>(p[i]);
    return AccVec<T>::loadu(buf);
#endif
  }
}

// The first n 16-bit lanes of bits (all of them by default) stored at p: a masked store
// (AVX512), or through a register-sized buffer (AVX2).
#if defined(CPU_CAPABILITY_AVX512)
inline void store_half_width(void* p, __m256i bits, int64_t n = 16) {
  if (n == 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  } else {
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << n) - 1), bits);
  }
}
#elif defined(CPU_CAPABILITY_AVX2)
inline void store_half_width(void* p, __m128i bits, int64_t n = 8) {
  if (n == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits);
  } else {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), bits);
    std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(uint16_t));
  }
}
#endif

// Store `n` (<= AccVec::size()) elements of v to p, rounding to T (round to nearest even).
template <typename T>
inline void store_acc(T* p, const AccVec<T>& v, int64_t n = AccVec<T>::size()) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    if (n == AccVec<T>::size()) {
      v.store(p);
    } else {
      v.store(p, n);
    }
  } else {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    // one fp32 vector -> one half-width vector of T, stored whole or its first n lanes
    store_half_width(p, half_bits<T>(v), n);
#else
    // Vectorized<T> holds two float vectors' worth of bf16/fp16: convert (v, v) and store the
    // first n lanes.
    at::vec::convert_from_float<T>(v, v).store(p, n);
#endif
  }
}

// A vector that every row reads (a bias, LayerNorm's beta) in the accumulation type: 16-bit
// values are widened once per call into a copy owned here, so that the rows load it without a
// conversion; fp32 and fp64 point at the data itself (null stays null).
template <typename T>
class AccRow {
 public:
  AccRow(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, acc_t<T>>) {
      data_ = p;
    } else if (p != nullptr) {
      constexpr int64_t W = AccVec<T>::size();
      copy_.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i += W) {
        const int64_t k = std::min<int64_t>(W, n - i);
        load_acc<T>(p + i, k).store(copy_.data() + i, k);
      }
      data_ = copy_.data();
    }
  }
  AccRow(const AccRow&) = delete;
  AccRow& operator=(const AccRow&) = delete;
  const acc_t<T>* data() const { return data_; }

 private:
  std::vector<acc_t<T>> copy_;
  const acc_t<T>* data_ = nullptr;
};

// v rounded to T and back (identity for fp32/fp64): the value a T tensor would hold, as
// store_acc<T> then load_acc<T> would give, in registers.
template <typename T>
inline AccVec<T> round_to(const AccVec<T>& v) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return v;
  } else {
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {  // the rounded upper halves, in place
      return _mm256_castsi256_ps(
          _mm256_and_si256(bf16_rounded_lanes(v), _mm256_set1_epi32(0xFFFF0000)));
    }
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    return widen_bits<T>(half_bits<T>(v));
#else
    alignas(64) T buf[AccVec<T>::size()];
    store_acc<T>(buf, v);
    return load_acc<T>(buf);
#endif
  }
}

// Software prefetch distance of the streaming kernels (bytes ahead of the chunk in hand): the
// hardware prefetchers alone leave loads waiting on memory where a kernel spends time between
// its loads (the gated activations' math, the normalisations' later passes over a cached row),
// and they stop at each 4 KiB page.
constexpr int64_t kPrefetchBytes = 4096;

// The cache level prefetch_ahead fills, as __builtin_prefetch's locality: rows of 4-byte (or
// wider) elements ask for a line every vector, and go to L2 only, since prefetches into L1 that
// fast hold the fill buffers the kernel's own loads and stores wait for; rows of 16-bit
// elements ask for a line every other vector, into L1.
template <typename T>
constexpr int kPrefetchLocality = sizeof(T) >= 4 ? 2 : 3;

// Requests the cache line kPrefetchBytes ahead of p (a hint: never faults, even past the end).
template <typename T>
C10_ALWAYS_INLINE void prefetch_ahead(const T* p) {
  __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, 0, kPrefetchLocality<T>);
}

// The same for a line about to be written (prefetchw where the CPU has it), to the same level.
template <typename T>
C10_ALWAYS_INLINE void prefetch_ahead_for_write(T* p) {
  __builtin_prefetch(reinterpret_cast<char*>(p) + kPrefetchBytes, 1, kPrefetchLocality<T>);
}

// Rows are split into blocks of this many rows for deterministic column reductions: the
// partial sums depend only on the shape, never on the thread count.
constexpr int64_t kReduceRowBlock = 64;

// Grain size (elements) for parallel_for over rows: below it one thread does the work.
constexpr int64_t kParallelGrainElems = 32768;

inline int64_t row_grain(int64_t features) {
  return std::max<int64_t>(1, kParallelGrainElems / std::max<int64_t>(features, 1));
}

}  // namespace te_cpp
