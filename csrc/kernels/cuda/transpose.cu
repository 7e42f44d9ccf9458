// CUDA backend of transpose_2d (the stub of ops/transpose.h): a shared-memory tiled transpose.
// A block of 32 x 8 threads moves one 32 x 32 tile: coalesced reads along x's rows into shared
// memory (one padding column, so the transposed reads hit 32 different banks), then coalesced
// writes along out's rows. A grid-stride loop over the tiles (64-bit indices) covers any shape.
// Elements are moved as unsigned integers of their size: bit for bit.
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "ops/transpose.h"

namespace te_cpp {
namespace {

constexpr int kTileDim = 32;
constexpr int kTileRows = 8;  // threadIdx.y: each thread moves kTileDim / kTileRows elements

template <typename T>
__global__ void __launch_bounds__(kTileDim * kTileRows)
    transpose_2d_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows,
                        int64_t cols, int64_t tile_cols, int64_t tiles) {
  __shared__ T tile[kTileDim][kTileDim + 1];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tile_cols * kTileDim, c0 = t % tile_cols * kTileDim;
    const int64_t c = c0 + threadIdx.x;
    for (int i = threadIdx.y; i < kTileDim; i += kTileRows) {
      const int64_t r = r0 + i;
      if (r < rows && c < cols) tile[i][threadIdx.x] = x[r * cols + c];
    }
    __syncthreads();
    const int64_t r = r0 + threadIdx.x;  // out[oc, r] for out's rows oc = c0 + i
    for (int i = threadIdx.y; i < kTileDim; i += kTileRows) {
      const int64_t oc = c0 + i;
      if (oc < cols && r < rows) out[oc * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is refilled by the next iteration
  }
}

template <typename T>
void launch(const Transpose2dArgs& a) {
  const int64_t tile_rows = (a.rows + kTileDim - 1) / kTileDim;
  const int64_t tile_cols = (a.cols + kTileDim - 1) / kTileDim;
  const int64_t tiles = tile_rows * tile_cols;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, kMaxBlocks));
  transpose_2d_kernel<T><<<blocks, dim3(kTileDim, kTileRows), 0, current_stream()>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.out), a.rows, a.cols, tile_cols, tiles);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void transpose_2d_cuda(const Transpose2dArgs& a) {
  visit_elem_type(a.elem_size, [&](auto e) { launch<decltype(e)>(a); });
}

}  // namespace

TE_REGISTER_KERNEL(transpose_2d_stub, CUDA, transpose_2d_cuda);

}  // namespace te_cpp
