// Deterministic column sums of a rows x features matrix whose elements are read or computed
// on the fly (bias_bwd's dbias, the dbias of dbias+dact): no atomics, an order of additions
// fixed by the shape alone, so the same bits every run.
//
// The rows are cut into `chunks` ranges of rows_per_chunk rows (column_chunks, from the row
// count alone). Pass 1 (column_partial_kernel): block (column tile, chunk) has kColThreads x
// kColRows threads; thread (tx, ty) owns M consecutive columns of the tile and adds rows
// ty, ty + kColRows, ... of the chunk in order; thread row 0 then adds the kColRows partials
// in ty order and writes partial[chunk][column]. Pass 2 (column_finish_kernel) adds each
// column's chunk partials in chunk order and rounds once to the output dtype. M (the vector
// width of the loads) changes which thread owns a column, never the order of its additions.
#pragma once

#include <algorithm>

#include "kernels/cuda/launch.cuh"

namespace te_cpp::cuda {

constexpr int kColThreads = 32;  // a warp reads 32 * M consecutive columns of a row: coalesced
constexpr int kColRows = 8;
constexpr int64_t kColChunkRowsMin = 128;  // fewer rows per chunk: too little work per block
constexpr int64_t kColMaxChunks = 128;     // bounds the partials to 128 rows of features
constexpr int64_t kMaxGridX = 65535;       // column tiles beyond it are walked grid-stride

struct ColumnChunks {
  int64_t chunks, rows_per_chunk;
};

inline ColumnChunks column_chunks(int64_t rows) {
  const int64_t chunks =
      std::clamp<int64_t>((rows + kColChunkRowsMin - 1) / kColChunkRowsMin, 1, kColMaxChunks);
  return {chunks, (rows + chunks - 1) / chunks};
}

// fn.template run<M>(r, col, v) computes row r's values at columns [col, col + M) into v (and
// may write other outputs); col is a multiple of M and col + M <= features.
template <int M, typename A, typename RowFn>
__global__ void column_partial_kernel(RowFn fn, A* __restrict__ partial, int64_t rows,
                                      int64_t features, int64_t rows_per_chunk) {
  // [ty][k][tx]: consecutive threads of a warp touch consecutive words
  __shared__ A tile[kColRows][M][kColThreads];
  const int64_t tiles = (features + kColThreads * M - 1) / (kColThreads * M);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t col = (t * kColThreads + threadIdx.x) * M;
    A sum[M];
#pragma unroll
    for (int k = 0; k < M; ++k) sum[k] = A(0);
    if (col < features) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
        A v[M];
        fn.template run<M>(r, col, v);
#pragma unroll
        for (int k = 0; k < M; ++k) sum[k] += v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < M; ++k) tile[threadIdx.y][k][threadIdx.x] = sum[k];
    __syncthreads();
    if (threadIdx.y == 0 && col < features) {
#pragma unroll
      for (int k = 0; k < M; ++k) {
        A total = tile[0][k][threadIdx.x];
        for (int j = 1; j < kColRows; ++j) total += tile[j][k][threadIdx.x];
        partial[static_cast<int64_t>(blockIdx.y) * features + col + k] = total;
      }
    }
    __syncthreads();  // the tile is reused by the next column tile
  }
}

// out[col] = sum over c of partial[c][col], in chunk order, rounded once to OutT.
template <typename A, typename OutT>
__global__ void column_finish_kernel(const A* __restrict__ partial, OutT* __restrict__ out,
                                     int64_t chunks, int64_t features) {
  for (int64_t col = grid_start(); col < features; col += grid_stride()) {
    A sum(0);
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * features + col];
    out[col] = static_cast<OutT>(sum);
  }
}

// The column sums of fn's rows x features values into out (features of OutT), on `stream`.
// features must be a multiple of M; zero rows give zeros.
template <int M, typename A, typename OutT, typename RowFn>
void column_reduce(const RowFn& fn, int64_t rows, int64_t features, OutT* out,
                   cudaStream_t stream) {
  const ColumnChunks c = column_chunks(rows);
  const Workspace partial(c.chunks * features * static_cast<int64_t>(sizeof(A)));
  A* pp = static_cast<A*>(partial.get());
  const int64_t tiles = (features + kColThreads * M - 1) / (kColThreads * M);
  const dim3 grid(static_cast<unsigned>(std::min(tiles, kMaxGridX)),
                  static_cast<unsigned>(c.chunks));
  column_partial_kernel<M, A><<<grid, dim3(kColThreads, kColRows), 0, stream>>>(
      fn, pp, rows, features, c.rows_per_chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  column_finish_kernel<A, OutT><<<blocks_for(features), kThreads, 0, stream>>>(
      pp, out, c.chunks, features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace te_cpp::cuda
