// CUDA kernels of the elementwise family: bias add and dbias, constant scale, residual adds.
//
// Each op runs its operator class's check() and allocate() (as the Meta and CPU kernels do),
// then works as the CPU kernel does: inputs converted to the output dtype and made contiguous,
// arithmetic in the accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), one rounding to
// the output dtype (round to nearest even). Kernels launch on the current stream of the
// tensors' device and never synchronise the host.
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "ops/elementwise.h"

namespace te_cpp {
namespace {

// The accumulation type of T: float for bf16/fp16/fp32, double for fp64 (as on CPU).
template <typename T>
using Acc = at::opmath_type<T>;

constexpr int kThreads = 256;
// One thread per element up to this many blocks; the grid-stride loops cover the rest, so the
// grid stays within CUDA's limits for any size.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// First index and stride of a grid-stride loop, in 64 bits (n may exceed 2^31).
__device__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

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

Tensor bias_fwd_cuda(const Tensor& x_in, const Tensor& bias_in) {
  BiasFwd::check(x_in, bias_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Tensor out = BiasFwd::allocate(x_in, bias_in);
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor x = x_in.to(out.scalar_type()).contiguous();
  const Tensor bias = bias_in.to(out.scalar_type()).contiguous();
  TE_DISPATCH_FLOAT(out.scalar_type(), "bias_fwd", [&] {
    bias_add_kernel<scalar_t><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(),
        out.mutable_data_ptr<scalar_t>(), n, bias.numel());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

Tensor bias_bwd_cuda(const Tensor& dy_in, at::ScalarType bias_dtype) {
  BiasBwd::check(dy_in, bias_dtype);
  const c10::cuda::CUDAGuard guard(dy_in.device());
  Tensor db = BiasBwd::allocate(dy_in, bias_dtype);
  const Tensor dy = dy_in.contiguous();
  const auto [rows, features] = rows_features(dy);
  if (features == 0) return db;
  // Zero rows give one chunk of zeros: dbias = 0, as on CPU.
  const int64_t chunks =
      std::clamp<int64_t>((rows + kChunkRowsMin - 1) / kChunkRowsMin, 1, kMaxChunks);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const auto stream = at::cuda::getCurrentCUDAStream();
  TE_DISPATCH_FLOAT(dy.scalar_type(), "bias_bwd", [&] {
    using T = scalar_t;
    using A = Acc<T>;
    const Tensor partial =
        at::empty({chunks, features}, dy.options().dtype(c10::CppTypeToScalarType<A>::value));
    const dim3 grid(static_cast<unsigned>((features + kTileCols - 1) / kTileCols),
                    static_cast<unsigned>(chunks));
    column_partial_sums_kernel<T><<<grid, dim3(kTileCols, kTileRows), 0, stream>>>(
        dy.const_data_ptr<T>(), partial.mutable_data_ptr<A>(), rows, features, rows_per_chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    TE_DISPATCH_FLOAT(db.scalar_type(), "bias_bwd", [&] {
      column_finish_kernel<A, scalar_t><<<blocks_for(features), kThreads, 0, stream>>>(
          partial.const_data_ptr<A>(), db.mutable_data_ptr<scalar_t>(), chunks, features);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return db;
}

Tensor scale_cuda(const char* op, const Tensor& x_in, double scale) {
  ConstantScale::check(op, x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  Tensor out = ConstantScale::allocate(x_in);
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor x = x_in.contiguous();
  TE_DISPATCH_FLOAT(x.scalar_type(), "constant_scale", [&] {
    // The scale is rounded to the accumulation type first, as on CPU.
    scale_kernel<scalar_t><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(),
        static_cast<Acc<scalar_t>>(scale), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

Tensor constant_scale_fwd_cuda(const Tensor& x, double scale) {
  return scale_cuda("constant_scale_fwd", x, scale);
}

Tensor constant_scale_bwd_cuda(const Tensor& dy, double scale) {
  return scale_cuda("constant_scale_bwd", dy, scale);
}

// out = a + b, all three contiguous and of one dtype (out may be a).
void add_into(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  TE_DISPATCH_FLOAT(out.scalar_type(), "residual_add", [&] {
    add_kernel<scalar_t><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(),
        out.mutable_data_ptr<scalar_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

Tensor residual_add_cuda(const char* op, const char* na, const Tensor& a, const char* nb,
                         const Tensor& b) {
  ResidualAdd::check(op, na, a, nb, b);
  const c10::cuda::CUDAGuard guard(a.device());
  Tensor out = ResidualAdd::allocate(a, b);
  add_into(a.to(out.scalar_type()).contiguous(), b.to(out.scalar_type()).contiguous(), out);
  return out;
}

// buffer += other, in the buffer's dtype (other is rounded to it first, as on CPU); a
// non-contiguous buffer is updated through a contiguous copy.
void residual_add_inplace_cuda(const char* op, const char* nbuf, const Tensor& buffer,
                               const char* nother, const Tensor& other) {
  ResidualAdd::check_inplace(op, nbuf, buffer, nother, other);
  const c10::cuda::CUDAGuard guard(buffer.device());
  const Tensor o = other.to(buffer.scalar_type()).contiguous();
  if (buffer.is_contiguous()) {
    add_into(buffer, o, buffer);
  } else {
    Tensor tmp = buffer.contiguous();
    add_into(tmp, o, tmp);
    const_cast<Tensor&>(buffer).copy_(tmp);
  }
}

Tensor add_extra_input_fwd_cuda(const Tensor& x, const Tensor& extra) {
  return residual_add_cuda("add_extra_input_fwd", "input", x, "extra_input", extra);
}

void add_extra_input_fwd_inplace_cuda(const Tensor& extra, const Tensor& x) {
  residual_add_inplace_cuda("add_extra_input_fwd_inplace", "extra_input", extra, "input", x);
}

Tensor make_extra_output_bwd_cuda(const Tensor& dy, const Tensor& dextra) {
  return residual_add_cuda("make_extra_output_bwd", "grad_output", dy, "grad_extra_output",
                           dextra);
}

void make_extra_output_bwd_inplace_cuda(const Tensor& dextra, const Tensor& dy) {
  residual_add_inplace_cuda("make_extra_output_bwd_inplace", "grad_extra_output", dextra,
                            "grad_output", dy);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CUDA, m) {
  m.impl("bias_fwd", bias_fwd_cuda);
  m.impl("bias_bwd", bias_bwd_cuda);
  m.impl("constant_scale_fwd", constant_scale_fwd_cuda);
  m.impl("constant_scale_bwd", constant_scale_bwd_cuda);
  m.impl("add_extra_input_fwd", add_extra_input_fwd_cuda);
  m.impl("add_extra_input_fwd_inplace", add_extra_input_fwd_inplace_cuda);
  m.impl("make_extra_output_bwd", make_extra_output_bwd_cuda);
  m.impl("make_extra_output_bwd_inplace", make_extra_output_bwd_inplace_cuda);
}

}  // namespace te_cpp
