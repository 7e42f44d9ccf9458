// CUDA backend of the elementwise family: bias add, column sums (dbias), constant scale, adds.
//
// As on CPU: arithmetic in the accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), one
// rounding to the output dtype (round to nearest even). The front end has made the current
// device the tensors'; kernels launch on its current stream and never synchronise the host.
#include <algorithm>

#include "kernels/cuda/launch.cuh"
#include "ops/elementwise.h"

namespace te_cpp {
namespace {

// y[i] = x[i] + bias[i % features] over the n = rows * features elements of a contiguous x.
template <typename T>
__global__ void bias_add_kernel(const T* __restrict__ x, const T* __restrict__ bias,
                                T* __restrict__ y, int64_t n, int64_t features) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    y[i] = static_cast<T>(static_cast<Acc<T>>(x[i]) + static_cast<Acc<T>>(bias[i % features]));
  }
}

// out[i] = x[i] * scale.
template <typename T>
__global__ void scale_kernel(const T* __restrict__ x, T* __restrict__ out, Acc<T> scale,
                             int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = static_cast<T>(static_cast<Acc<T>>(x[i]) * scale);
  }
}

// out[i] = a[i] + b[i]. Not __restrict__: the in-place ops pass out == a (and maybe b == a);
// each element is read before it is written by the same thread.
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = static_cast<T>(static_cast<Acc<T>>(a[i]) + static_cast<Acc<T>>(b[i]));
  }
}

// bias_bwd's column sums, deterministic and without atomics: the rows are cut into `chunks`
// ranges of rows_per_chunk rows, chosen from the shape alone. Pass 1 (this kernel): block
// (column tile, chunk) sums its chunk for kTileCols columns; thread (tx, ty) adds rows ty,
// ty + kTileRows, ... in order, then thread row 0 adds the kTileRows partials in ty order and
// writes partial[chunk][column]. Pass 2 (column_finish_kernel) adds each column's chunk
// partials in chunk order. The order of every addition is fixed: the same bits every run.
constexpr int kTileCols = 32;  // a warp reads 32 consecutive columns of a row: coalesced
constexpr int kTileRows = 8;
constexpr int64_t kChunkRowsMin = 128;  // fewer rows per chunk: too little work per block
constexpr int64_t kMaxChunks = 128;     // bounds the partial buffer to 128 rows of features

template <typename T>
__global__ void column_partial_sums_kernel(const T* __restrict__ dy, Acc<T>* __restrict__ partial,
                                           int64_t rows, int64_t features,
                                           int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A tile[kTileRows][kTileCols];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
  A sum(0);
  if (col < features) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows) {
      sum += static_cast<A>(dy[r * features + col]);
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < features) {
    A total = tile[0][threadIdx.x];
    for (int k = 1; k < kTileRows; ++k) total += tile[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * features + col] = total;
  }
}

// out[col] = sum over c of partial[c][col], in chunk order, rounded once to the bias dtype.
template <typename A, typename OutT>
__global__ void column_finish_kernel(const A* __restrict__ partial, OutT* __restrict__ out,
                                     int64_t chunks, int64_t features) {
  for (int64_t col = grid_start(); col < features; col += grid_stride()) {
    A sum(0);
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * features + col];
    out[col] = static_cast<OutT>(sum);
  }
}

void bias_add_cuda(const BiasAddArgs& a) {
  const int64_t n = a.rows * a.features;
  TE_DISPATCH_FLOAT(a.dtype, "bias_fwd", [&] {
    using T = scalar_t;
    bias_add_kernel<T><<<blocks_for(n), kThreads, 0, current_stream()>>>(
        static_cast<const T*>(a.x), static_cast<const T*>(a.bias), static_cast<T*>(a.y), n,
        a.features);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void column_sum_cuda(const ColumnSumArgs& a) {
  // Zero rows give one chunk of zeros: the sums are 0, as on CPU.
  const int64_t chunks =
      std::clamp<int64_t>((a.rows + kChunkRowsMin - 1) / kChunkRowsMin, 1, kMaxChunks);
  const int64_t rows_per_chunk = (a.rows + chunks - 1) / chunks;
  const auto stream = current_stream();
  TE_DISPATCH_FLOAT(a.dtype, "bias_bwd", [&] {
    using T = scalar_t;
    using A = Acc<T>;
    const Workspace partial(chunks * a.features * static_cast<int64_t>(sizeof(A)));
    A* pp = static_cast<A*>(partial.get());
    const dim3 grid(static_cast<unsigned>((a.features + kTileCols - 1) / kTileCols),
                    static_cast<unsigned>(chunks));
    column_partial_sums_kernel<T><<<grid, dim3(kTileCols, kTileRows), 0, stream>>>(
        static_cast<const T*>(a.dy), pp, a.rows, a.features, rows_per_chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    TE_DISPATCH_FLOAT(a.out_dtype, "bias_bwd", [&] {
      column_finish_kernel<A, scalar_t><<<blocks_for(a.features), kThreads, 0, stream>>>(
          pp, static_cast<scalar_t*>(a.out), chunks, a.features);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void scale_cuda(const ScaleArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "constant_scale", [&] {
    using T = scalar_t;
    // The scale is rounded to the accumulation type first, as on CPU.
    scale_kernel<T><<<blocks_for(a.n), kThreads, 0, current_stream()>>>(
        static_cast<const T*>(a.x), static_cast<T*>(a.out), static_cast<Acc<T>>(a.scale), a.n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void add_cuda(const AddArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "residual_add", [&] {
    using T = scalar_t;
    add_kernel<T><<<blocks_for(a.n), kThreads, 0, current_stream()>>>(
        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TE_REGISTER_KERNEL(bias_add_stub, CUDA, bias_add_cuda);
TE_REGISTER_KERNEL(column_sum_stub, CUDA, column_sum_cuda);
TE_REGISTER_KERNEL(scale_stub, CUDA, scale_cuda);
TE_REGISTER_KERNEL(add_stub, CUDA, add_cuda);

}  // namespace te_cpp
