// CPU backend of transpose_2d (the stub of ops/transpose.h): the matrix is cut into cache
// tiles of kTile x kTile elements, transposed in parallel over tiles (at::parallel_for).
// Inside a tile, where AVX2 or AVX-512 is compiled, K x K blocks (K = 16 / element size: one
// 16-byte vector per row, 16x16 for bytes) are transposed in registers
// (kernels/cpu/transpose_block.h); the tile's ragged edges, and every tile in a build without
// them, take the scalar loop. Elements are moved as unsigned integers of their size: bit for bit.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include <ATen/Parallel.h>

#include "kernels/cpu/transpose_block.h"
#include "ops/transpose.h"

namespace te_cpp {
namespace {

// Elements per side of a tile: a 64x64 tile of 4-byte elements (16 KiB) and its transposed
// buffer stay in L1 together (of 8-byte elements, in L2).
constexpr int64_t kTile = 64;

// out[c, r] = x[r, c] over rows [r0, r1) and columns [c0, c1); writes run along out's rows.
template <typename T>
void scalar_block(const T* x, T* out, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                  int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    const T* src = x + r0 * cols + c;
    T* dst = out + c * rows;
    for (int64_t r = r0; r < r1; ++r, src += cols) dst[r] = *src;
  }
}

// The tile at (r0, c0). A full tile is transposed into a contiguous buffer first, then copied
// out a row at a time: out's rows lie `rows` elements apart, often a multiple of 4 KiB, so the
// tile's K-element pieces of them would share a few L1 sets and evict one another before
// their lines are complete; the buffer keeps every write of the tile in distinct sets, and
// each row of out is then written in one piece.
template <typename T>
void transpose_tile(const T* x, T* out, int64_t rows, int64_t cols, int64_t r0, int64_t c0) {
  const int64_t r1 = std::min(r0 + kTile, rows), c1 = std::min(c0 + kTile, cols);
#ifdef TE_TRANSPOSE_SIMD
  constexpr int64_t K = 16 / sizeof(T);
  if (r1 - r0 == kTile && c1 - c0 == kTile) {
    alignas(64) T buf[kTile * kTile];
    for (int64_t r = 0; r < kTile; r += K) {  // K rows of x, reused by every block along them
      for (int64_t c = 0; c < kTile; c += K) {
        cpu::transpose_block(x + (r0 + r) * cols + c0 + c, cols, buf + c * kTile + r, kTile);
      }
    }
    for (int64_t c = 0; c < kTile; ++c) {
      std::memcpy(out + (c0 + c) * rows + r0, buf + c * kTile, kTile * sizeof(T));
    }
    return;
  }
  const int64_t rv = r0 + (r1 - r0) / K * K, cv = c0 + (c1 - c0) / K * K;
  for (int64_t r = r0; r < rv; r += K) {
    for (int64_t c = c0; c < cv; c += K) {
      cpu::transpose_block(x + r * cols + c, cols, out + c * rows + r, rows);
    }
  }
  scalar_block(x, out, rows, cols, r0, rv, cv, c1);  // the columns right of the blocks
  scalar_block(x, out, rows, cols, rv, r1, c0, c1);  // the rows below them
#else
  scalar_block(x, out, rows, cols, r0, r1, c0, c1);
#endif
}

template <typename T>
void transpose_typed(const Transpose2dArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const int64_t rows = a.rows, cols = a.cols;
  const int64_t tile_rows = (rows + kTile - 1) / kTile, tile_cols = (cols + kTile - 1) / kTile;
  // about 64 KiB of input per task: a smaller transpose runs on the calling thread
  const int64_t grain = std::max<int64_t>(1, 65536 / (kTile * kTile * int64_t{sizeof(T)}));
  // tiles in column-band order: consecutive tiles write consecutive pieces of the same rows
  // of out (at 4096x4096 bytes 2.5x faster than the row-band order, whose every tile wrote
  // to 64 new pages of out)
  at::parallel_for(0, tile_rows * tile_cols, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      transpose_tile(x, out, rows, cols, t % tile_rows * kTile, t / tile_rows * kTile);
    }
  });
}

void transpose_2d_cpu(const Transpose2dArgs& a) {
  if (a.rows == 1 || a.cols == 1) {  // a vector's transpose has its bytes in the same order
    std::memcpy(a.out, a.x, static_cast<size_t>(a.rows * a.cols * a.elem_size));
    return;
  }
  visit_elem_type(a.elem_size, [&](auto e) { transpose_typed<decltype(e)>(a); });
}

}  // namespace

TE_REGISTER_KERNEL(transpose_2d_stub, CPU, transpose_2d_cpu);

}  // namespace te_cpp
