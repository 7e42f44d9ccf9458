// Launch helpers shared by the CUDA backends: the accumulation type, grid sizing, the current
// stream and temporary device memory from torch's caching allocator.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdint>

#include "common/common.h"

namespace te_cpp {

// The accumulation type of T: float for bf16/fp16/fp32, double for fp64 (as on CPU).
template <typename T>
using Acc = at::opmath_type<T>;

constexpr int kThreads = 256;
// One thread per element up to this many blocks; the grid-stride loops cover the rest, so the
// grid stays within CUDA's limits for any size.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// First index and stride of a grid-stride loop, in 64 bits (n may exceed 2^31).
__device__ inline int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Elements of T in one 16-byte vector load or store.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// Whether p is a multiple of `bytes` (a power of two): what a vector load or store of that
// width needs.
inline bool aligned(const void* p, int64_t bytes = 16) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// The current stream of the current device (the front end's device guard chose the device).
inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// Scratch device memory for one backend call, from torch's caching allocator: freed (returned
// to the cache, stream-ordered) when it goes out of scope, so it is safe under graph capture.
class Workspace {
 public:
  explicit Workspace(int64_t bytes)
      : ptr_(c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes))) {}
  void* get() const { return ptr_.get(); }

 private:
  c10::DataPtr ptr_;
};

}  // namespace te_cpp
