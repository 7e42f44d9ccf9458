// at::vec helpers: load any supported scalar type as fp32 (fp64 stays fp64) vectors, with
// partial loads for row tails, so kernels are written once over `Vectorized<acc_t>`.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

namespace te_cpp {

// Accumulation type: double for double, float for float / bf16 / fp16.
template <typename T>
using acc_t = at::opmath_type<T>;

template <typename T>
using AccVec = at::vec::Vectorized<acc_t<T>>;

// Load `n` (<= AccVec::size()) elements starting at p, converted to the accumulation type.
template <typename T>
inline AccVec<T> load_acc(const T* p, int64_t n = AccVec<T>::size()) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, A>) {
    return n == AccVec<T>::size() ? AccVec<T>::loadu(p) : AccVec<T>::loadu(p, n);
  } else {
    if (n == AccVec<T>::size()) {
      AccVec<T> out;
      at::vec::load_to_float<T>(p, out);  // vectorised bf16/fp16 -> fp32
      return out;
    }
    alignas(64) A buf[AccVec<T>::size()] = {};
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<A>(p[i]);
    return AccVec<T>::loadu(buf);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
inline void store_half_width(void* p, __m256i bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
}
#elif defined(CPU_CAPABILITY_AVX2)
inline void store_half_width(void* p, __m128i bits) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits);
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
#if defined(CPU_CAPABILITY_AVX512) && defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      // vcvtneps2bf16: round to nearest even in one instruction (NaN stays NaN; fp32
      // denormals, below 1.2e-38, become zero), then a whole or a masked store
      const __m256i bits = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
      if (n == AccVec<T>::size()) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
      } else {
        _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << n) - 1), bits);
      }
      return;
    }
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    if (n == AccVec<T>::size()) {
      // one fp32 vector -> one half-width vector of T, stored whole (no staging buffer)
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        store_half_width(p, at::vec::cvtfp32_bf16(v));
        return;
      } else if constexpr (std::is_same_v<T, c10::Half>) {
        store_half_width(p, at::vec::cvtfp32_fp16(v));
        return;
      }
    }
#endif
    // Vectorized<T> holds two float vectors' worth of bf16/fp16: convert (v, v) and store the
    // first n lanes.
    at::vec::convert_from_float<T>(v, v).store(p, n);
  }
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
