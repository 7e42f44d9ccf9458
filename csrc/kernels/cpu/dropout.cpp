// CPU kernels of Dropout (see ops/dropout.h for the mask's definition). Elements run in
// parallel chunks; each chunk positions a Philox engine at its first element's counter, draws
// one 32-bit value per element, and applies the keep multiplier (0 or 1 / (1 - p)) with
// Vectorized<acc_t> arithmetic. The mask depends only on (seed, element index).
#include <ATen/core/PhiloxRNGEngine.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/vec.h"
#include "ops/dropout.h"

namespace te_cpp {
namespace {

// Elements are kept iff their 32-bit draw is >= this threshold: probability 1 - p (up to the
// 2^-32 rounding of p).
uint64_t keep_threshold(double p) {
  return static_cast<uint64_t>(std::llround(std::ldexp(p, 32)));
}

std::tuple<Tensor, Tensor> dropout_fwd_cpu(const Tensor& x_in, const Tensor& seed_in, double p) {
  DropoutFwd::check(x_in, seed_in, p);
  auto [y, mask] = DropoutFwd::allocate(x_in);
  const Tensor x = x_in.contiguous();
  const uint64_t seed = static_cast<uint64_t>(seed_in.contiguous().const_data_ptr<int64_t>()[0]);
  const uint64_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  TE_DISPATCH_FLOAT(x.scalar_type(), "dropout_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const A keep_value = static_cast<A>(scale);
    const T* xp = x.const_data_ptr<T>();
    T* yp = y.mutable_data_ptr<T>();
    uint8_t* mp = mask.mutable_data_ptr<uint8_t>();
    at::parallel_for(0, x.numel(), kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      // Element i is lane i % 4 of the Philox block at offset i / 4 (subsequence 0).
      at::philox_engine rng(seed, /*subsequence=*/0, /*offset=*/static_cast<uint64_t>(i0) / 4);
      for (int64_t lane = 0; lane < i0 % 4; ++lane) rng();
      alignas(64) A mult[W];
      for (int64_t i = i0; i < i1; i += W) {
        const int64_t k = std::min<int64_t>(W, i1 - i);
        for (int64_t j = 0; j < k; ++j) {
          const bool keep = static_cast<uint64_t>(rng()) >= threshold;
          mp[i + j] = keep ? 1 : 0;
          mult[j] = keep ? keep_value : A(0);
        }
        store_acc<T>(yp + i, load_acc<T>(xp + i, k) * Vec::loadu(mult, k), k);
      }
    });
  });
  return {y, mask};
}

Tensor dropout_bwd_cpu(const Tensor& dy_in, const Tensor& mask_in, double p) {
  DropoutBwd::check(dy_in, mask_in, p);
  Tensor dx = DropoutBwd::allocate(dy_in);
  const Tensor dy = dy_in.contiguous();
  const Tensor mask = mask_in.contiguous();
  const double scale = 1.0 / (1.0 - p);
  TE_DISPATCH_FLOAT(dy.scalar_type(), "dropout_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const A keep_value = static_cast<A>(scale);
    const T* dyp = dy.const_data_ptr<T>();
    const uint8_t* mp = mask.const_data_ptr<uint8_t>();
    T* dxp = dx.mutable_data_ptr<T>();
    at::parallel_for(0, dy.numel(), kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      alignas(64) A mult[W];
      for (int64_t i = i0; i < i1; i += W) {
        const int64_t k = std::min<int64_t>(W, i1 - i);
        for (int64_t j = 0; j < k; ++j) mult[j] = mp[i + j] != 0 ? keep_value : A(0);
        store_acc<T>(dxp + i, load_acc<T>(dyp + i, k) * Vec::loadu(mult, k), k);
      }
    });
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) {
  m.impl("dropout_fwd", dropout_fwd_cpu);
  m.impl("dropout_bwd", dropout_bwd_cpu);
}

}  // namespace te_cpp
