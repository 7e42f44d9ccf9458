// CUDA backend of the grouped family: each group's GEMM is the linear family's cuBLASLt GEMM
// (gemm_stub's CUDA kernel), one after the other on the current stream; the bias parts are
// small kernels launched per non-empty group: the scaled bias add over the group's rows, the
// dbias column sums (cuda::column_reduce: deterministic, no atomics; zeros for an empty group)
// and the dscales row dots (one warp per row, a fixed shuffle order).
//
// As on CPU: arithmetic in the accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), a
// product and a sum never fused (--fmad=false), one rounding to the output dtype.
#include <type_traits>

#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "ops/grouped.h"

namespace te_cpp {
namespace {

void grouped_gemm_cuda(c10::ArrayRef<GemmArgs> gemms) {
  for (const GemmArgs& g : gemms) gemm_stub(c10::DeviceType::CUDA, g);
}

// y[r, j] += s[r] * bias[j] over the rows x n elements of a group (y and s at its first row).
// In place: each element is read and written by one thread.
template <typename T, typename S>
__global__ void scaled_bias_kernel(T* y, const S* __restrict__ s, const T* __restrict__ bias,
                                   int64_t rows, int64_t n) {
  using A = Acc<T>;
  const int64_t total = rows * n;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t r = i / n, j = i - r * n;
    const A prod = static_cast<A>(s[r]) * static_cast<A>(bias[j]);
    y[i] = static_cast<T>(static_cast<A>(y[i]) + prod);
  }
}

// Row r's values s[r] * dy[r, col] of a group (dy and s at its first row; s null: 1), the
// rows column_reduce sums into dbias.
template <typename T, typename S>
struct ScaledDyRows {
  const T* dy;
  const S* s;
  int64_t features;
  template <int M>
  __device__ void run(int64_t r, int64_t col, Acc<T>* v) const {
    using A = Acc<T>;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const A d = static_cast<A>(dy[r * features + col + k]);
      v[k] = s != nullptr ? static_cast<A>(s[r]) * d : d;
    }
  }
};

constexpr int kWarpsPerBlock = kThreads / 32;

// ds[r] = sum over j of dy[r, j] * bias[j], one warp per row: lane l adds the columns
// l, l + 32, ... in order, then the lanes are summed by an xor shuffle tree (a fixed order).
template <typename T, typename S>
__global__ void row_dot_kernel(const T* __restrict__ dy, const T* __restrict__ bias,
                               S* __restrict__ ds, int64_t rows, int64_t n) {
  using A = Acc<T>;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = warp; r < rows; r += warps) {
    const T* d = dy + r * n;
    A sum(0);
    for (int64_t j = lane; j < n; j += 32) {
      const A prod = static_cast<A>(d[j]) * static_cast<A>(bias[j]);
      sum += prod;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) ds[r] = static_cast<S>(sum);
  }
}

void grouped_scaled_bias_cuda(const GroupedScaledBiasArgs& a) {
  const int64_t n = a.features;
  TE_DISPATCH_FLOAT(a.dtype, "grouped_linear_fwd", [&] {
    using T = scalar_t;
    with_scale_type<T>(a.scale_dtype, [&](auto tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      for (size_t g = 0; g + 1 < a.offsets.size(); ++g) {
        const int64_t r0 = a.offsets[g], rows = a.offsets[g + 1] - r0;
        if (rows == 0) continue;
        scaled_bias_kernel<T, S><<<blocks_for(rows * n), kThreads, 0, current_stream()>>>(
            static_cast<T*>(a.y) + r0 * n, static_cast<const S*>(a.scales) + r0,
            static_cast<const T*>(a.biases[g]), rows, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
}

void grouped_bias_bwd_cuda(const GroupedBiasBwdArgs& a) {
  const int64_t n = a.features;
  TE_DISPATCH_FLOAT(a.dtype, "grouped_bias_bwd", [&] {
    using T = scalar_t;
    const T* dy = static_cast<const T*>(a.dy);
    with_scale_type<T>(a.scale_dtype, [&](auto tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      const S* sp = static_cast<const S*>(a.scales);
      TE_DISPATCH_FLOAT(a.bias_dtype, "grouped_bias_bwd", [&] {
        using B = scalar_t;
        for (size_t g = 0; g < a.dbiases.size(); ++g) {
          const int64_t r0 = a.offsets[g], rows = a.offsets[g + 1] - r0;
          const ScaledDyRows<T, S> fn{dy + r0 * n, sp != nullptr ? sp + r0 : nullptr, n};
          cuda::column_reduce<1, Acc<T>>(fn, rows, n, static_cast<B*>(a.dbiases[g]),
                                         current_stream());
        }
      });
      if (sp == nullptr) return;
      for (size_t g = 0; g < a.dbiases.size(); ++g) {
        const int64_t r0 = a.offsets[g], rows = a.offsets[g + 1] - r0;
        if (rows == 0) continue;
        const unsigned blocks = static_cast<unsigned>(
            std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks));
        row_dot_kernel<T, S><<<blocks, kThreads, 0, current_stream()>>>(
            dy + r0 * n, static_cast<const T*>(a.biases[g]), static_cast<S*>(a.dscales) + r0,
            rows, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(grouped_gemm_stub, CUDA, grouped_gemm_cuda);
TE_REGISTER_KERNEL(grouped_scaled_bias_stub, CUDA, grouped_scaled_bias_cuda);
TE_REGISTER_KERNEL(grouped_bias_bwd_stub, CUDA, grouped_bias_bwd_cuda);

}  // namespace te_cpp
