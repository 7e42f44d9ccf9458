// Dropout's mask rule, shared by every backend (ops/dropout.h states it): element i of the
// row-major flattened input is kept iff lane i % 4 of Philox4x32-10 (ATen's philox_engine,
// C10_HOST_DEVICE) with key = seed at counter (i / 4, subsequence 0) is >= the keep threshold.
// The CPU and CUDA kernels draw through these functions, so their masks are the same bits.
#pragma once

// PhiloxRNGEngine.h uses AT_ASSERT (in a host-only function) without including its header
#include <c10/util/Exception.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

namespace te_cpp::dropout {

// The keep threshold round(p * 2^32) (ties away from zero): a 32-bit draw keeps its element
// iff draw >= threshold, probability 1 - p up to the 2^-32 rounding of p. Host code: the front
// end computes it once and passes it to the backend.
inline uint64_t keep_threshold(double p) {
  return static_cast<uint64_t>(std::llround(std::ldexp(p, 32)));
}

// The multiplier of the kept elements, 1 / (1 - p) in double (the backends round it once to
// the accumulation type).
inline double keep_scale(double p) { return 1.0 / (1.0 - p); }

C10_HOST_DEVICE inline bool keep(uint32_t draw, uint64_t threshold) {
  return static_cast<uint64_t>(draw) >= threshold;
}

// A Philox engine positioned at element i: its next draw is element i's, the draws after it
// those of i + 1, i + 2, ...
C10_HOST_DEVICE inline at::philox_engine engine_at(uint64_t seed, uint64_t i) {
  at::philox_engine rng(seed, /*subsequence=*/0, /*offset=*/i / 4);
  for (uint64_t lane = 0; lane < i % 4; ++lane) rng();
  return rng;
}

}  // namespace te_cpp::dropout
