// CUDA backend of the elementwise family: bias add, column sums (dbias), constant scale, adds.
//
// As on CPU: arithmetic in the accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), one
// rounding to the output dtype (round to nearest even). The front end has made the current
// device the tensors'; kernels launch on its current stream and never synchronise the host.
#include "kernels/cuda/column_reduce.cuh"
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

// Row r's values at columns [col, col + M) of a contiguous dy: the rows column_reduce sums.
template <typename T>
struct DyRows {
  const T* dy;
  int64_t features;
  template <int M>
  __device__ void run(int64_t r, int64_t col, Acc<T>* v) const {
#pragma unroll
    for (int k = 0; k < M; ++k) v[k] = static_cast<Acc<T>>(dy[r * features + col + k]);
  }
};

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
  // bias_bwd's column sums: cuda::column_reduce, deterministic without atomics; zero rows give
  // zeros, as on CPU
  TE_DISPATCH_FLOAT(a.dtype, "bias_bwd", [&] {
    using T = scalar_t;
    const DyRows<T> rows{static_cast<const T*>(a.dy), a.features};
    TE_DISPATCH_FLOAT(a.out_dtype, "bias_bwd", [&] {
      cuda::column_reduce<1, Acc<T>>(rows, a.rows, a.features, static_cast<scalar_t*>(a.out),
                                     current_stream());
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
