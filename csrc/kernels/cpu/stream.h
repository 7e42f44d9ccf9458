// Non-temporal ("streaming") stores for outputs larger than the last-level cache.
//
// A plain store of a line that is not in the cache first reads it from memory (read for
// ownership), so a kernel writing an output that cannot stay in the cache moves its bytes
// twice. A non-temporal store writes the line without reading it and without evicting cached
// data, but leaves the output out of the cache: worth it only where the output is too large to
// be there when the next op reads it. The kernels ask stream_stores<T>(output elements) once
// per call, write their outputs with store_out (a non-temporal store for a whole, aligned
// vector, a plain one otherwise: the bytes written are the same either way) and call
// stream_fence at the end of each thread's share, which orders the non-temporal stores before
// whatever follows.
//
// Only fp32 and fp64 outputs stream: the bf16 / fp16 kernels are bound by their own work on
// the development CPUs, and streaming their half-line vectors measured no gain
// (docs/architecture.md, "Streaming stores").
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/stream_threshold.h"
#include "kernels/cpu/vec.h"

namespace te_cpp::cpu {

// Whether an output of `elements` T streams: fp32 / fp64 at or above the threshold.
template <typename T>
inline bool stream_stores(int64_t elements) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return elements > 0 &&
           elements * static_cast<int64_t>(sizeof(T)) >= stream_store_min_bytes();
  } else {
    return false;
  }
}

// store_acc<T>(p, v, n), as a non-temporal store where `stream` is set, T is fp32 or fp64, v is
// a whole vector and p is aligned to its width.
template <typename T>
C10_ALWAYS_INLINE void store_out(T* p, const AccVec<T>& v, int64_t n, bool stream) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr int64_t kLanes = AccVec<T>::size();
    constexpr uintptr_t kAlign = sizeof(T) * kLanes;
    if (stream && n == kLanes && reinterpret_cast<uintptr_t>(p) % kAlign == 0) {
#if defined(CPU_CAPABILITY_AVX512)
      if constexpr (std::is_same_v<T, float>) {
        _mm512_stream_ps(p, v);
      } else {
        _mm512_stream_pd(p, v);
      }
#else
      if constexpr (std::is_same_v<T, float>) {
        _mm256_stream_ps(p, v);
      } else {
        _mm256_stream_pd(p, v);
      }
#endif
      return;
    }
  }
#endif
  store_acc<T>(p, v, n);
}

// Orders this thread's non-temporal stores before its later memory operations (sfence).
C10_ALWAYS_INLINE void stream_fence(bool stream) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

}  // namespace te_cpp::cpu
