// CUDA backend of Dropout (the stubs of ops/dropout.h). The mask rule is
// common/dropout_math.h's, the one the CPU kernel runs: a thread handles one Philox block of 4
// consecutive elements (counter i / 4), so CPU and CUDA masks are the same bits. The seed is
// read from device memory by the kernel.
#include <cstdint>

#include "common/dropout_math.h"
#include "kernels/cuda/launch.cuh"
#include "ops/dropout.h"

namespace te_cpp {
namespace {

// 4 consecutive elements of T in one aligned load or store.
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};
struct alignas(4) Mask4 {
  uint8_t v[4];
};

// Thread k handles elements 4k .. 4k + 3 (one Philox block); kVec: the whole-block loads and
// stores are aligned (the tail block is always element by element).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    dropout_fwd_kernel(const T* __restrict__ x, const int64_t* __restrict__ seed_ptr,
                       uint64_t threshold, Acc<T> keep_value, T* __restrict__ y,
                       uint8_t* __restrict__ mask, int64_t n) {
  using A = Acc<T>;
  const uint64_t seed = static_cast<uint64_t>(*seed_ptr);
  const int64_t nblk = (n + 3) / 4;
  for (int64_t k = grid_start(); k < nblk; k += grid_stride()) {
    at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(k) * 4);
    bool keep[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) keep[j] = dropout::keep(rng(), threshold);
    const int64_t i0 = k * 4;
    if (kVec && i0 + 4 <= n) {
      const Pack4<T> in = reinterpret_cast<const Pack4<T>*>(x)[k];
      Pack4<T> out;
      Mask4 m;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out.v[j] = static_cast<T>(static_cast<A>(in.v[j]) * (keep[j] ? keep_value : A(0)));
        m.v[j] = keep[j] ? 1 : 0;
      }
      reinterpret_cast<Pack4<T>*>(y)[k] = out;
      reinterpret_cast<Mask4*>(mask)[k] = m;
    } else {
      for (int j = 0; j < 4 && i0 + j < n; ++j) {
        y[i0 + j] = static_cast<T>(static_cast<A>(x[i0 + j]) * (keep[j] ? keep_value : A(0)));
        mask[i0 + j] = keep[j] ? 1 : 0;
      }
    }
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    dropout_bwd_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask,
                       Acc<T> keep_value, T* __restrict__ dx, int64_t n) {
  using A = Acc<T>;
  const int64_t nblk = (n + 3) / 4;
  for (int64_t k = grid_start(); k < nblk; k += grid_stride()) {
    const int64_t i0 = k * 4;
    if (kVec && i0 + 4 <= n) {
      const Pack4<T> in = reinterpret_cast<const Pack4<T>*>(dy)[k];
      const Mask4 m = reinterpret_cast<const Mask4*>(mask)[k];
      Pack4<T> out;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out.v[j] = static_cast<T>(static_cast<A>(in.v[j]) * (m.v[j] != 0 ? keep_value : A(0)));
      }
      reinterpret_cast<Pack4<T>*>(dx)[k] = out;
    } else {
      for (int j = 0; j < 4 && i0 + j < n; ++j) {
        dx[i0 + j] =
            static_cast<T>(static_cast<A>(dy[i0 + j]) * (mask[i0 + j] != 0 ? keep_value : A(0)));
      }
    }
  }
}

void dropout_fwd_cuda(const DropoutFwdArgs& a) {
  const auto stream = current_stream();
  const int64_t nblk = (a.n + 3) / 4;
  TE_DISPATCH_FLOAT(a.dtype, "dropout_fwd", [&] {
    using T = scalar_t;
    const auto keep_value = static_cast<Acc<T>>(a.scale);
    const bool vec = aligned(a.x, 4 * sizeof(T)) && aligned(a.y, 4 * sizeof(T)) &&
                     aligned(a.mask, 4);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(nblk), kThreads, 0, stream>>>(
          static_cast<const T*>(a.x), a.seed, a.threshold, keep_value, static_cast<T*>(a.y),
          a.mask, a.n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vec) {
      launch(dropout_fwd_kernel<T, true>);
    } else {
      launch(dropout_fwd_kernel<T, false>);
    }
  });
}

void dropout_bwd_cuda(const DropoutBwdArgs& a) {
  const auto stream = current_stream();
  const int64_t nblk = (a.n + 3) / 4;
  TE_DISPATCH_FLOAT(a.dtype, "dropout_bwd", [&] {
    using T = scalar_t;
    const auto keep_value = static_cast<Acc<T>>(a.scale);
    const bool vec = aligned(a.dy, 4 * sizeof(T)) && aligned(a.dx, 4 * sizeof(T)) &&
                     aligned(a.mask, 4);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(nblk), kThreads, 0, stream>>>(static_cast<const T*>(a.dy), a.mask,
                                                        keep_value, static_cast<T*>(a.dx), a.n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vec) {
      launch(dropout_bwd_kernel<T, true>);
    } else {
      launch(dropout_bwd_kernel<T, false>);
    }
  });
}

}  // namespace

TE_REGISTER_KERNEL(dropout_fwd_stub, CUDA, dropout_fwd_cuda);
TE_REGISTER_KERNEL(dropout_bwd_stub, CUDA, dropout_bwd_cuda);

}  // namespace te_cpp
