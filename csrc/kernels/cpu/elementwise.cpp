// CPU backend of the elementwise family: bias add, column sums (dbias), constant scale, adds.
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/stream.h"
#include "kernels/cpu/vec.h"
#include "ops/elementwise.h"

namespace te_cpp {
namespace {

// out[i] = f(a[i], b[i]) over n contiguous elements, in parallel chunks; f works on AccVec.
template <typename T, typename F>
void binary_map(const T* a, const T* b, T* out, int64_t n, const F& f) {
  constexpr int64_t W = AccVec<T>::size();
  const bool stream = cpu::stream_stores<T>(n);
  at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + W <= i1; i += W) {
      cpu::store_out<T>(out + i, f(load_acc<T>(a + i), load_acc<T>(b + i)), W, stream);
    }
    if (i < i1) {
      const int64_t k = i1 - i;
      store_acc<T>(out + i, f(load_acc<T>(a + i, k), load_acc<T>(b + i, k)), k);
    }
    cpu::stream_fence(stream);
  });
}

template <typename T, typename F>
void unary_map(const T* a, T* out, int64_t n, const F& f) {
  constexpr int64_t W = AccVec<T>::size();
  const bool stream = cpu::stream_stores<T>(n);
  at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + W <= i1; i += W) cpu::store_out<T>(out + i, f(load_acc<T>(a + i)), W, stream);
    if (i < i1) store_acc<T>(out + i, f(load_acc<T>(a + i, i1 - i)), i1 - i);
    cpu::stream_fence(stream);
  });
}

void bias_add_cpu(const BiasAddArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "bias_fwd", [&] {
    using T = scalar_t;
    constexpr int64_t W = AccVec<T>::size();
    const T* xp = static_cast<const T*>(a.x);
    const int64_t features = a.features;
    const AccRow<T> bias(static_cast<const T*>(a.bias), features);
    const acc_t<T>* bp = bias.data();
    T* yp = static_cast<T*>(a.y);
    const bool stream = cpu::stream_stores<T>(a.rows * features);
    at::parallel_for(0, a.rows, row_grain(features), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * features;
        T* yr = yp + r * features;
        int64_t f = 0;
        for (; f + W <= features; f += W) {
          cpu::store_out<T>(yr + f, load_acc<T>(xr + f) + load_acc(bp + f), W, stream);
        }
        if (f < features) {
          const int64_t k = features - f;
          store_acc<T>(yr + f, load_acc<T>(xr + f, k) + load_acc(bp + f, k), k);
        }
      }
      cpu::stream_fence(stream);
    });
  });
}

void column_sum_cpu(const ColumnSumArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "bias_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* dyp = static_cast<const T*>(a.dy);
    const int64_t features = a.features;
    TE_DISPATCH_FLOAT(a.out_dtype, "bias_bwd", [&] {
      cpu::blocked_column_sum<A>(a.rows, features, static_cast<scalar_t*>(a.out),
                                 [&](int64_t r, A* acc) {
                                   cpu::accumulate_row<T>(acc, dyp + r * features, features);
                                 });
    });
  });
}

void scale_cpu(const ScaleArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "constant_scale", [&] {
    using T = scalar_t;
    const AccVec<T> s(static_cast<acc_t<T>>(a.scale));
    unary_map<T>(static_cast<const T*>(a.x), static_cast<T*>(a.out), a.n,
                 [&](const AccVec<T>& v) { return v * s; });
  });
}

void add_cpu(const AddArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "residual_add", [&] {
    using T = scalar_t;
    binary_map<T>(static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out),
                  a.n, [](const AccVec<T>& u, const AccVec<T>& v) { return u + v; });
  });
}

}  // namespace

TE_REGISTER_KERNEL(bias_add_stub, CPU, bias_add_cpu);
TE_REGISTER_KERNEL(column_sum_stub, CPU, column_sum_cpu);
TE_REGISTER_KERNEL(scale_stub, CPU, scale_cpu);
TE_REGISTER_KERNEL(add_stub, CPU, add_cpu);

}  // namespace te_cpp
