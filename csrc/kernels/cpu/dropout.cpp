// CPU backend of Dropout (the stubs of ops/dropout.h; the mask rule is common/dropout_math.h's,
// shared with CUDA). Elements run in parallel chunks; each chunk positions a Philox engine at
// its first element, draws one 32-bit value per element, and applies the keep multiplier
// (0 or 1 / (1 - p)) with Vectorized<acc_t> arithmetic. The mask depends only on (seed,
// element index).
#include <cstdint>

#include "common/dropout_math.h"
#include "kernels/cpu/vec.h"
#include "ops/dropout.h"

namespace te_cpp {
namespace {

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
    at::parallel_for(0, a.n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(i0));
      alignas(64) A mult[W];
      for (int64_t i = i0; i < i1; i += W) {
        const int64_t k = std::min<int64_t>(W, i1 - i);
        for (int64_t j = 0; j < k; ++j) {
          const bool keep = dropout::keep(rng(), threshold);
          mp[i + j] = keep ? 1 : 0;
          mult[j] = keep ? keep_value : A(0);
        }
        store_acc<T>(yp + i, load_acc<T>(xp + i, k) * Vec::loadu(mult, k), k);
      }
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
