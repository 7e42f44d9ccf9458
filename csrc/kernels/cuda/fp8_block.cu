// CUDA backend of Float8BlockScaling's quantize ops (the stubs of ops/fp8_block.h). The rules
// that decide the bits are common/fp8.h's, the ones the CPU kernels run, so the bytes are the
// CPU's. A block's amax is a NaN-skipping maximum (fp8::block_amax_step per element, then
// fmaxf across threads on values that are never NaN): exact in any order, so the kernels are
// deterministic.
//
// 1x128 blocks: one warp per block, each lane 4 elements (grid-stride over the blocks).
// 128x128 tiles: one thread block per tile, the amax reduced through shared memory.
#include <algorithm>
#include <cstdint>

#include "common/fp8.h"
#include "kernels/cuda/launch.cuh"
#include "ops/fp8_block.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

constexpr int64_t kB = fp8::kFp8BlockSize;
constexpr int kWarpsPerBlock = kThreads / 32;
static_assert(kB == 128 && kThreads % 32 == 0, "a warp covers a 1x128 block, 4 per lane");

struct ScaleRule {
  float fp8_max, amax_epsilon, value_for_inf;
  bool pow2;
  __device__ float operator()(float amax) const {
    return fp8::compute_scale(amax, fp8_max, pow2, amax_epsilon, value_for_inf);
  }
};

template <typename T, c10::ScalarType F>
__global__ void __launch_bounds__(kThreads)
    block_1d_kernel(const T* __restrict__ x, uint8_t* __restrict__ data,
                    float* __restrict__ scale_inv, int64_t rows, int64_t cols, ScaleRule rule) {
  const int64_t ncb = (cols + kB - 1) / kB;
  const int64_t nblocks = rows * ncb;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = warp; b < nblocks; b += nwarps) {
    const int64_t r = b / ncb, c0 = (b % ncb) * kB;
    const int64_t len = cols - c0 < kB ? cols - c0 : kB;
    const T* xb = x + r * cols + c0;
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = lane + 32 * j;
      v[j] = c < len ? static_cast<float>(xb[c]) : 0.0f;
      amax = fp8::block_amax_step(amax, v[j]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    const float s = rule(amax);
    if (lane == 0) scale_inv[b] = fp8::scale_inv(s);
    uint8_t* db = data + r * cols + c0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = lane + 32 * j;
      if (c < len) db[c] = fp8::cast_to_fp8<F>(v[j] * s);
    }
  }
}

template <typename T, c10::ScalarType F>
__global__ void __launch_bounds__(kThreads)
    block_2d_kernel(const T* __restrict__ x, uint8_t* __restrict__ data,
                    float* __restrict__ scale_inv, int64_t rows, int64_t cols, ScaleRule rule) {
  __shared__ float warp_amax[kWarpsPerBlock];
  __shared__ float tile_scale;
  const int64_t ncb = (cols + kB - 1) / kB, nrb = (rows + kB - 1) / kB;
  for (int64_t t = blockIdx.x; t < nrb * ncb; t += gridDim.x) {
    const int64_t r0 = (t / ncb) * kB, c0 = (t % ncb) * kB;
    const int64_t nr = rows - r0 < kB ? rows - r0 : kB;
    const int64_t nc = cols - c0 < kB ? cols - c0 : kB;
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
      const float v = static_cast<float>(x[(r0 + i / nc) * cols + c0 + i % nc]);
      amax = fp8::block_amax_step(amax, v);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    }
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (int w = 0; w < kWarpsPerBlock; ++w) m = fmaxf(m, warp_amax[w]);
      const float s = rule(m);
      tile_scale = s;
      scale_inv[t] = fp8::scale_inv(s);
    }
    __syncthreads();
    const float s = tile_scale;
    for (int64_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
      const int64_t idx = (r0 + i / nc) * cols + c0 + i % nc;
      data[idx] = fp8::cast_to_fp8<F>(static_cast<float>(x[idx]) * s);
    }
    __syncthreads();  // tile_scale and warp_amax are rewritten by the next tile
  }
}

void fp8_block_quantize_cuda(const Fp8BlockQuantizeArgs& a) {
  const auto stream = current_stream();
  const ScaleRule rule{fp8::max_norm(a.fp8_dtype), a.amax_epsilon, a.value_for_inf,
                       a.force_pow_2_scales};
  const int64_t ncb = (a.cols + kB - 1) / kB;
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_block_quantize", [&] {
    using T = scalar_t;
    const T* x = static_cast<const T*>(a.x);
    auto launch = [&](auto fmt) {
      constexpr c10::ScalarType F = decltype(fmt)::value;
      if (a.block_dim == 1) {
        const int64_t nblocks = a.rows * ncb;  // one warp each
        block_1d_kernel<T, F><<<blocks_for(nblocks * 32), kThreads, 0, stream>>>(
            x, a.data, a.scale_inv, a.rows, a.cols, rule);
      } else {
        const int64_t tiles = ((a.rows + kB - 1) / kB) * ncb;  // one thread block each
        const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, kMaxBlocks));
        block_2d_kernel<T, F><<<grid, kThreads, 0, stream>>>(x, a.data, a.scale_inv, a.rows,
                                                             a.cols, rule);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (a.fp8_dtype == fp8::kE4M3) {
      launch(std::integral_constant<c10::ScalarType, fp8::kE4M3>{});
    } else {
      launch(std::integral_constant<c10::ScalarType, fp8::kE5M2>{});
    }
  });
}

// out[r, c] = OutT(fp8_to_float(data) * scale_inv[block]), the product in fp32.
template <c10::ScalarType F, typename OutT>
__global__ void __launch_bounds__(kThreads)
    block_dequantize_kernel(const uint8_t* __restrict__ data, const float* __restrict__ scale_inv,
                            OutT* __restrict__ out, int64_t rows, int64_t cols, int block_dim) {
  const int64_t ncb = (cols + kB - 1) / kB;
  const int64_t n = rows * cols;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / cols, c = i % cols;
    const float s = scale_inv[(block_dim == 1 ? r : r / kB) * ncb + c / kB];
    out[i] = static_cast<OutT>(fp8::fp8_to_float<F>(data[i]) * s);
  }
}

void fp8_block_dequantize_cuda(const Fp8BlockDequantizeArgs& a) {
  const auto stream = current_stream();
  const int64_t n = a.rows * a.cols;
  TE_DISPATCH_FLOAT(a.out_dtype, "fp8_block_dequantize", [&] {
    using OutT = scalar_t;
    OutT* out = static_cast<OutT*>(a.out);
    if (a.fp8_dtype == fp8::kE4M3) {
      block_dequantize_kernel<fp8::kE4M3, OutT><<<blocks_for(n), kThreads, 0, stream>>>(
          a.data, a.scale_inv, out, a.rows, a.cols, a.block_dim);
    } else {
      block_dequantize_kernel<fp8::kE5M2, OutT><<<blocks_for(n), kThreads, 0, stream>>>(
          a.data, a.scale_inv, out, a.rows, a.cols, a.block_dim);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TE_REGISTER_KERNEL(fp8_block_quantize_stub, CUDA, fp8_block_quantize_cuda);
TE_REGISTER_KERNEL(fp8_block_dequantize_stub, CUDA, fp8_block_dequantize_cuda);

}  // namespace te_cpp
