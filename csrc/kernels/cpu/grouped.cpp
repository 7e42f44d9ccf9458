// CPU backend of the grouped family. Each group's GEMM is the linear family's CPU GEMM (ATen's
// at::mm_out / at::addmm_out on views of the front end's buffers); many small groups run in
// parallel over the groups, each GEMM on one thread. The bias parts are ours: a row pass for
// the scaled bias, the blocked column sums of kernels/cpu/reduce.h for dbias and a row dot
// product for dscales.
//
// Thread-count independence: whether the groups run in parallel depends on the shapes alone;
// in parallel each GEMM runs on one thread (ATen's nested parallel regions run inline and
// MKL / oneDNN run sequentially inside an OpenMP region), and the reductions' order is fixed by
// the shape.
#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec.h"
#include "ops/grouped.h"

namespace te_cpp {
namespace {

// Groups whose GEMMs average fewer multiply-adds than this run in parallel over the groups
// (a GEMM this small gains little from ATen's own threads).
constexpr int64_t kSmallGroupMacs = int64_t{1} << 22;

void grouped_gemm_cpu(c10::ArrayRef<GemmArgs> gemms) {
  const int64_t count = static_cast<int64_t>(gemms.size());
  int64_t macs = 0;
  for (const GemmArgs& g : gemms) macs += g.m * g.n * std::max<int64_t>(g.k, 1);
  if (count > 1 && macs / count < kSmallGroupMacs) {
    at::parallel_for(0, count, 1, [&](int64_t i0, int64_t i1) {
      // the dispatcher's thread-local state is not carried into the worker threads
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (int64_t i = i0; i < i1; ++i) gemm_stub(c10::DeviceType::CPU, gemms[i]);
    });
    return;
  }
  for (const GemmArgs& g : gemms) gemm_stub(c10::DeviceType::CPU, g);
}

// The group of row r: offsets[g] <= r < offsets[g + 1] (the last such g: empty groups share
// their offset with the next one).
int64_t group_of(c10::ArrayRef<int64_t> offsets, int64_t r) {
  return std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin() - 1;
}

void grouped_scaled_bias_cpu(const GroupedScaledBiasArgs& a) {
  const int64_t rows = a.offsets.back(), n = a.features;
  TE_DISPATCH_FLOAT(a.dtype, "grouped_linear_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = AccVec<T>::size();
    T* y = static_cast<T*>(a.y);
    with_scale_type<T>(a.scale_dtype, [&](auto tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      const S* sp = static_cast<const S*>(a.scales);
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        int64_t g = group_of(a.offsets, r0);
        for (int64_t r = r0; r < r1; ++r) {
          while (a.offsets[g + 1] <= r) ++g;
          const T* b = static_cast<const T*>(a.biases[g]);
          const AccVec<T> s(static_cast<A>(sp[r]));
          T* yr = y + r * n;
          cpu::for_chunks<W>(n, [&](int64_t i, int64_t k) {
            store_acc<T>(yr + i, load_acc<T>(yr + i, k) + s * load_acc<T>(b + i, k), k);
          });
        }
      });
    });
  });
}

// sum over j of u[j] * v[j] in A: lane-wise partial sums, then the lanes in order.
template <typename T, typename A = acc_t<T>>
A dot(const T* u, const T* v, int64_t n) {
  constexpr int64_t W = AccVec<T>::size();
  AccVec<T> acc(A(0));
  cpu::for_chunks<W>(n, [&](int64_t i, int64_t k) {
    acc = acc + load_acc<T>(u + i, k) * load_acc<T>(v + i, k);  // partial loads pad with 0
  });
  alignas(64) A lanes[W];
  acc.store(lanes);
  A sum(0);
  for (int64_t i = 0; i < W; ++i) sum += lanes[i];
  return sum;
}

void grouped_bias_bwd_cpu(const GroupedBiasBwdArgs& a) {
  const int64_t n = a.features, groups = static_cast<int64_t>(a.dbiases.size());
  TE_DISPATCH_FLOAT(a.dtype, "grouped_bias_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using V = at::vec::Vectorized<A>;
    const T* dy = static_cast<const T*>(a.dy);
    with_scale_type<T>(a.scale_dtype, [&](auto tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      const S* sp = static_cast<const S*>(a.scales);
      TE_DISPATCH_FLOAT(a.bias_dtype, "grouped_bias_bwd", [&] {
        using B = scalar_t;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = a.offsets[g], rows = a.offsets[g + 1] - r0;
          const T* dyg = dy + r0 * n;
          B* out = static_cast<B*>(a.dbiases[g]);
          if (sp == nullptr) {
            cpu::blocked_column_sum<A>(rows, n, out, [&](int64_t r, A* acc) {
              cpu::accumulate_row<T>(acc, dyg + r * n, n);
            });
            continue;
          }
          // acc += s_t * dy_t (a product, then a sum: no fused multiply-add)
          cpu::blocked_column_sum<A>(rows, n, out, [&](int64_t r, A* acc) {
            const V s(static_cast<A>(sp[r0 + r]));
            const T* d = dyg + r * n;
            cpu::for_chunks<V::size()>(n, [&](int64_t i, int64_t k) {
              (V::loadu(acc + i, k) + s * load_acc<T>(d + i, k)).store(acc + i, k);
            });
          });
        }
      });
      if (sp == nullptr) return;
      S* ds = static_cast<S*>(a.dscales);
      const int64_t rows = a.offsets.back();
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        int64_t g = group_of(a.offsets, r0);
        for (int64_t r = r0; r < r1; ++r) {
          while (a.offsets[g + 1] <= r) ++g;
          ds[r] = static_cast<S>(dot<T>(dy + r * n, static_cast<const T*>(a.biases[g]), n));
        }
      });
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(grouped_gemm_stub, CPU, grouped_gemm_cpu);
TE_REGISTER_KERNEL(grouped_scaled_bias_stub, CPU, grouped_scaled_bias_cpu);
TE_REGISTER_KERNEL(grouped_bias_bwd_stub, CPU, grouped_bias_bwd_cpu);

}  // namespace te_cpp
