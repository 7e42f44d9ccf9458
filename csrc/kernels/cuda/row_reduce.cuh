// Row-wise kernels of the normalisation family (LayerNorm, RMSNorm, L2Normalization): how a
// row is cut into 16-byte chunks and shared among a warp or a block, the loads and stores of
// a chunk, the fixed-order group sums, and the launch plan, all chosen from the shape alone.
//
// A row of n elements is cut into chunks of kVec = 16 / sizeof(T) elements (the last one
// partial). Thread `lane` of a group of `size` threads (one warp, or one block) owns chunks
// lane, lane + size, lane + 2 size, ... of every row it visits, and accumulates them in that
// order; the group then adds its threads' sums in a fixed tree (warp shuffles, then the warps
// in order). A chunk is one 16-byte load when the row is aligned, else element loads: the
// order of the arithmetic is the same either way, so the result depends on the shape alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/launch.cuh"

namespace te_cpp::rowwise {

constexpr int kWarp = 32;
// Chunks per thread that the cached kernels keep in registers (the forward kernels cache x,
// the backward ones x and dy); rows with more use the uncached kernel, which reads the row
// again for each pass (from L1/L2).
constexpr int kFwdCacheChunks = 4;
constexpr int kBwdCacheChunks = 2;
// Warp-per-row kernels: this many warps (rows) per block.
constexpr int kWarpsPerBlock = 8;
// Block-per-row kernels: at most this many threads per block. The row kernels are declared
// __launch_bounds__(kMaxRowThreads), which keeps them within 128 registers per thread (the
// cached LayerNorm backward keeps x, dy, gamma, and the dweight and dbias sums per cache slot).
constexpr int kMaxRowThreads = 512;
constexpr int64_t kMaxRowBlocks = int64_t{1} << 16;

// The values of one chunk, as loaded from / stored to memory.
template <typename T>
struct alignas(16) Pack {
  T v[kVec<T>];
};

// v[j] = row[start + j] in A for start + j < n, else 0.
template <typename T, typename A>
__device__ inline void load_chunk(const T* __restrict__ row, int64_t start, int64_t n,
                                  bool aligned, A (&v)[kVec<T>]) {
  if (aligned && start + kVec<T> <= n) {
    const Pack<T> p = *reinterpret_cast<const Pack<T>*>(row + start);
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) v[j] = static_cast<A>(p.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) v[j] = start + j < n ? static_cast<A>(row[start + j]) : A(0);
  }
}

// row[start + j] = v[j] rounded to T, for start + j < n.
template <typename T, typename A>
__device__ inline void store_chunk(T* __restrict__ row, int64_t start, int64_t n, bool aligned,
                                   const A (&v)[kVec<T>]) {
  if (aligned && start + kVec<T> <= n) {
    Pack<T> p;
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) p.v[j] = static_cast<T>(v[j]);
    *reinterpret_cast<Pack<T>*>(row + start) = p;
  } else {
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) {
      if (start + j < n) row[start + j] = static_cast<T>(v[j]);
    }
  }
}

// The threads that share a row: one warp (kWarpRow) or the whole block.
template <bool kWarpRow>
struct Group {
  int lane;       // this thread's index in the group
  int size;       // threads in the group
  int64_t id;     // the group's index in the grid
  int64_t count;  // groups in the grid

  __device__ Group() {
    if constexpr (kWarpRow) {
      const int warps = static_cast<int>(blockDim.x) / kWarp;
      lane = static_cast<int>(threadIdx.x) % kWarp;
      size = kWarp;
      id = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / kWarp;
      count = static_cast<int64_t>(gridDim.x) * warps;
    } else {
      lane = static_cast<int>(threadIdx.x);
      size = static_cast<int>(blockDim.x);
      id = blockIdx.x;
      count = gridDim.x;
    }
  }
};

// The sum of v over the warp, the same in every lane: a butterfly, where the two lanes of each
// pair add the same two values (a + b == b + a), so every lane ends with the same bits.
template <typename A>
__device__ inline A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The sum of v over the group, the same in every thread of it. Block groups: the warps' sums
// are added in warp order by every thread; scratch holds kWarp values of shared memory, and
// every thread of the block must call this (the calls are __syncthreads barriers).
template <bool kWarpRow, typename A>
__device__ inline A group_sum(A v, A* scratch) {
  v = warp_sum(v);
  if constexpr (kWarpRow) {
    return v;
  } else {
    const int warps = static_cast<int>(blockDim.x) / kWarp;
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    A total = scratch[0];
    for (int w = 1; w < warps; ++w) total += scratch[w];
    __syncthreads();  // scratch may be written again by the next call
    return total;
  }
}

// Calls f(start, v) for each chunk of the row this thread owns, v its values in A (0 past the
// row's end), in chunk order. kCached: the thread owns at most kChunks chunks, kept in `cache`
// (loaded from `row` when `load`, else as a previous pass left them).
template <bool kCached, int kChunks, typename T, typename A, typename F>
__device__ inline void for_my_chunks(const T* __restrict__ row, int64_t n, bool aligned,
                                     int lane, int size, A (&cache)[kChunks][kVec<T>], bool load,
                                     const F& f) {
  const int64_t nchunks = (n + kVec<T> - 1) / kVec<T>;
  if constexpr (kCached) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t c = lane + static_cast<int64_t>(k) * size;
      if (c < nchunks) {
        if (load) load_chunk<T>(row, c * kVec<T>, n, aligned, cache[k]);
        f(c * kVec<T>, cache[k]);
      }
    }
  } else {
    for (int64_t c = lane; c < nchunks; c += size) {
      A v[kVec<T>];
      load_chunk<T>(row, c * kVec<T>, n, aligned, v);
      f(c * kVec<T>, v);
    }
  }
}

// How a row-wise kernel is launched, from rows x features and the element size alone (and the
// kernel's cache_chunks):
//   warp:   rows of at most kWarp * cache_chunks chunks, one warp per row, cached;
//   cached: one block per row, enough threads (up to kMaxRowThreads) for cache_chunks chunks
//           each;
//   else:   one block of kMaxRowThreads / 2 threads per row, reading the row once per pass.
struct RowPlan {
  bool warp_per_row;
  bool cached;
  int threads;
  int64_t groups;  // rows in flight at once: warps (warp_per_row) or blocks

  unsigned blocks() const {
    return static_cast<unsigned>(warp_per_row ? (groups + kWarpsPerBlock - 1) / kWarpsPerBlock
                                              : groups);
  }
};

inline int64_t chunks_of(int64_t features, int elem_bytes) {
  const int64_t vec = 16 / elem_bytes;
  return (features + vec - 1) / vec;
}

// max_groups: an upper bound on the groups (the rows in flight), at most kMaxRowBlocks blocks.
inline RowPlan plan_rows(int64_t features, int elem_bytes, int cache_chunks,
                         int64_t max_groups) {
  const int64_t nchunks = chunks_of(features, elem_bytes);
  RowPlan p{};
  if (nchunks <= kWarp * cache_chunks) {
    p.warp_per_row = true;
    p.cached = true;
    p.threads = kWarp * kWarpsPerBlock;
    p.groups = std::clamp<int64_t>(max_groups, 1, kMaxRowBlocks * kWarpsPerBlock);
  } else {
    p.warp_per_row = false;
    const int64_t threads = (nchunks + cache_chunks - 1) / cache_chunks;
    p.cached = threads <= kMaxRowThreads;
    p.threads = p.cached ? static_cast<int>((threads + kWarp - 1) / kWarp * kWarp)
                         : kMaxRowThreads / 2;
    p.groups = std::clamp<int64_t>(max_groups, 1, kMaxRowBlocks);
  }
  return p;
}

// Whether every row of n elements of T, from each of the (non-null) base pointers, starts on
// 16 bytes: the chunks' 16-byte loads and stores are then aligned.
template <typename T>
bool rows_aligned(int64_t n, std::initializer_list<const void*> bases) {
  if ((n * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  for (const void* b : bases) {
    if (b != nullptr && !aligned(b)) return false;
  }
  return true;
}

}  // namespace te_cpp::rowwise
