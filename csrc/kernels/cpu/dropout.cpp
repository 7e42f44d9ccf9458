// CPU backend of Dropout (the stubs of ops/dropout.h; the mask rule is common/dropout_math.h's,
// shared with CUDA). Elements run in parallel chunks; a chunk draws one 32-bit value per element,
// from its first multiple of 4 on in groups of counters on vectors (philox_vec.h), its head and
// tail from a Philox engine positioned at their first element, and applies the keep multiplier
// (0 or 1 / (1 - p)) with Vectorized<acc_t> arithmetic. The mask depends only on (seed,
// element index).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dropout_math.h"
#include "kernels/cpu/philox_vec.h"
#include "kernels/cpu/vec.h"
#include "ops/dropout.h"

namespace te_cpp {
namespace {

#if defined(TE_PHILOX_SIMD)
// dropout::keep of one vector of draws: the mask bytes (1 kept, 0 dropped) stored at m, and the
// multipliers (keep_value or 0) returned. A threshold of 2^32 keeps nothing.
inline at::vec::Vectorized<float> keep_lanes(const uint32_t* d, uint64_t threshold,
                                             float keep_value, uint8_t* m) {
  const uint32_t t = static_cast<uint32_t>(std::min<uint64_t>(threshold, UINT32_MAX));
  const bool none = threshold > UINT32_MAX;
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i v = _mm512_loadu_si512(d);
  const __mmask16 k = none ? 0 : _mm512_cmpge_epu32_mask(v, _mm512_set1_epi32(static_cast<int>(t)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(m), _mm_maskz_mov_epi8(k, _mm_set1_epi8(1)));
  return _mm512_maskz_mov_ps(k, _mm512_set1_ps(keep_value));
#else
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d));
  // draw >= t unsigned: max(draw, t) == draw
  __m256i k = _mm256_cmpeq_epi32(_mm256_max_epu32(v, _mm256_set1_epi32(static_cast<int>(t))), v);
  if (none) k = _mm256_setzero_si256();
  // the lanes' all-ones / zero words packed to bytes, then 1 / 0
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(m),
                   _mm_and_si128(_mm_packs_epi16(w, w), _mm_set1_epi8(1)));
  return _mm256_and_ps(_mm256_castsi256_ps(k), _mm256_set1_ps(keep_value));
#endif
}

// One vector of elements (fp32 accumulation) from its draws d: y = x * keep_lanes. False
// (nothing done) for fp64, whose vectors are narrower than the draws'.
template <typename T>
inline bool keep_vector(const T* x, T* y, uint8_t* m, const uint32_t* d, uint64_t threshold,
                        acc_t<T> keep_value) {
  if constexpr (std::is_same_v<acc_t<T>, float>) {
    store_acc<T>(y, load_acc<T>(x) * keep_lanes(d, threshold, keep_value, m));
    return true;
  } else {
    return false;
  }
}
#endif

void dropout_fwd_cpu(const DropoutFwdArgs& a) {
  const uint64_t seed = static_cast<uint64_t>(*a.seed);
  const uint64_t threshold = a.threshold;
  TE_DISPATCH_FLOAT(a.dtype, "dropout_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const A keep_value = static_cast<A>(a.scale);
    const T* xp = static_cast<const T*>(a.x);
    T* yp = static_cast<T*>(a.y);
    uint8_t* mp = a.mask;
    // elements [i, i + k), k <= W, with draw(j) the draw of element i + j
    auto apply = [&](int64_t i, int64_t k, const auto& draw) {
      alignas(64) A mult[W];
      for (int64_t j = 0; j < k; ++j) {
        const bool keep = dropout::keep(draw(j), threshold);
        mp[i + j] = keep ? 1 : 0;
        mult[j] = keep ? keep_value : A(0);
      }
      store_acc<T>(yp + i, load_acc<T>(xp + i, k) * Vec::loadu(mult, k), k);
    };
    // the engine's draws from element i on, one at a time, over [i, end)
    auto scalar_run = [&](int64_t i, int64_t end) {
      at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(i));
      for (; i < end; i += W) {
        apply(i, std::min<int64_t>(W, end - i), [&](int64_t) { return rng(); });
      }
    };
    at::parallel_for(0, a.n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      int64_t i = i0;
#if defined(TE_PHILOX_SIMD)
      // from the first multiple of 4, whole groups of kGroup elements drawn on vectors
      constexpr int64_t kGroup = 4 * cpu::kPhiloxLanes;
      static_assert(kGroup % W == 0, "a group is a whole number of vectors");
      const int64_t start = std::min(i1, (i0 + 3) / 4 * 4);
      scalar_run(i, start);
      i = start;
      alignas(64) uint32_t draws[kGroup];
      for (; i + kGroup <= i1; i += kGroup) {
        cpu::philox_draws(seed, static_cast<uint64_t>(i / 4), draws);
        for (int64_t j = 0; j < kGroup; j += W) {
          if (!keep_vector<T>(xp + i + j, yp + i + j, mp + i + j, draws + j, threshold,
                              keep_value)) {
            apply(i + j, W, [&](int64_t m) { return draws[j + m]; });
          }
        }
      }
#endif
      scalar_run(i, i1);
    });
  });
}

void dropout_bwd_cpu(const DropoutBwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "dropout_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const A keep_value = static_cast<A>(a.scale);
    const T* dyp = static_cast<const T*>(a.dy);
    const uint8_t* mp = a.mask;
    T* dxp = static_cast<T*>(a.dx);
    at::parallel_for(0, a.n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      alignas(64) A mult[W];
      for (int64_t i = i0; i < i1; i += W) {
        const int64_t k = std::min<int64_t>(W, i1 - i);
        for (int64_t j = 0; j < k; ++j) mult[j] = mp[i + j] != 0 ? keep_value : A(0);
        store_acc<T>(dxp + i, load_acc<T>(dyp + i, k) * Vec::loadu(mult, k), k);
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(dropout_fwd_stub, CPU, dropout_fwd_cpu);
TE_REGISTER_KERNEL(dropout_bwd_stub, CPU, dropout_bwd_cpu);

}  // namespace te_cpp
