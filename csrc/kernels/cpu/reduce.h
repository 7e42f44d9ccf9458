// Deterministic column reduction for the CPU kernels (dbias, dgamma): rows are cut into
// fixed blocks of kReduceRowBlock rows; each block accumulates its rows in order into its own
// partial row (in the accumulation type), then the partials are summed in block order. The
// result depends only on the shape, never on the number of threads, and uses no atomics.
#pragma once

#include <vector>

#include "common/vec.h"

namespace te_cpp::cpu {

// row_fn(r, acc) must add row r's contribution into acc[0 .. features).
// The column sums are written to out[0 .. features) converted to OutT.
template <typename A, typename OutT, typename RowFn>
void blocked_column_sum(int64_t rows, int64_t features, OutT* out, const RowFn& row_fn) {
  using V = at::vec::Vectorized<A>;
  const int64_t nblocks = (rows + kReduceRowBlock - 1) / kReduceRowBlock;
  std::vector<A> partial(static_cast<size_t>(std::max<int64_t>(nblocks, 1) * features), A(0));
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      A* acc = partial.data() + b * features;
      const int64_t r_end = std::min(rows, (b + 1) * kReduceRowBlock);
      for (int64_t r = b * kReduceRowBlock; r < r_end; ++r) row_fn(r, acc);
    }
  });
  at::parallel_for(0, features, 4096, [&](int64_t f0, int64_t f1) {
    int64_t f = f0;
    for (; f + V::size() <= f1; f += V::size()) {
      V s(A(0));
      for (int64_t b = 0; b < nblocks; ++b) s += V::loadu(partial.data() + b * features + f);
      alignas(64) A tmp[V::size()];
      s.store(tmp);
      for (int64_t i = 0; i < V::size(); ++i) out[f + i] = static_cast<OutT>(tmp[i]);
    }
    for (; f < f1; ++f) {
      A s(0);
      for (int64_t b = 0; b < nblocks; ++b) s += partial[b * features + f];
      out[f] = static_cast<OutT>(s);
    }
  });
}

// acc[0..n) += v[0..n) where v is loaded from T and converted to A.
template <typename T, typename A = acc_t<T>>
inline void accumulate_row(A* acc, const T* v, int64_t n) {
  using V = at::vec::Vectorized<A>;
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) {
    (V::loadu(acc + i) + load_acc<T>(v + i)).store(acc + i);
  }
  if (i < n) {
    const int64_t k = n - i;
    (V::loadu(acc + i, k) + load_acc<T>(v + i, k)).store(acc + i, k);
  }
}

}  // namespace te_cpp::cpu
