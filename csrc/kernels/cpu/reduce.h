// Deterministic column reductions for the CPU kernels (dbias, dgamma, dbeta): rows are cut
// into fixed blocks of kReduceRowBlock rows; each block accumulates its rows in order into its
// own partial row (in the accumulation type), then the partials are summed in block order.
// The result depends only on the shape, never on the number of threads, and uses no atomics.
#pragma once

#include <vector>

#include "kernels/cpu/stream.h"
#include "kernels/cpu/vec.h"

namespace te_cpp::cpu {

// row_fn(r, acc) must add row r's contribution into acc[0 .. width). Returns the column sums
// over all rows, in the accumulation type A. Rows may also write other outputs in row_fn, with
// non-temporal stores where `stream` is set (each thread fences once, after its rows).
template <typename A, typename RowFn>
std::vector<A> blocked_column_sums(int64_t rows, int64_t width, const RowFn& row_fn,
                                   bool stream = false) {
  using V = at::vec::Vectorized<A>;
  const int64_t nblocks = (rows + kReduceRowBlock - 1) / kReduceRowBlock;
  std::vector<A> partial(static_cast<size_t>(std::max<int64_t>(nblocks, 1) * width), A(0));
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      A* acc = partial.data() + b * width;
      const int64_t r_end = std::min(rows, (b + 1) * kReduceRowBlock);
      for (int64_t r = b * kReduceRowBlock; r < r_end; ++r) row_fn(r, acc);
    }
    stream_fence(stream);
  });
  if (nblocks <= 1) {
    partial.resize(static_cast<size_t>(width));
    return partial;
  }
  std::vector<A> sums(static_cast<size_t>(width));
  at::parallel_for(0, width, 4096, [&](int64_t f0, int64_t f1) {
    int64_t f = f0;
    for (; f + V::size() <= f1; f += V::size()) {
      V s(A(0));
      for (int64_t b = 0; b < nblocks; ++b) s += V::loadu(partial.data() + b * width + f);
      s.store(sums.data() + f);
    }
    for (; f < f1; ++f) {
      A s(0);
      for (int64_t b = 0; b < nblocks; ++b) s += partial[b * width + f];
      sums[f] = s;
    }
  });
  return sums;
}

// Column sums converted to OutT and written to out[0 .. width).
template <typename A, typename OutT, typename RowFn>
void blocked_column_sum(int64_t rows, int64_t width, OutT* out, const RowFn& row_fn) {
  const std::vector<A> sums = blocked_column_sums<A>(rows, width, row_fn);
  for (int64_t f = 0; f < width; ++f) out[f] = static_cast<OutT>(sums[f]);
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

// Calls body(offset, count) over [0, n) in chunks of W, the last one partial.
template <int64_t W, typename Body>
inline void for_chunks(int64_t n, const Body& body) {
  int64_t i = 0;
  for (; i + W <= n; i += W) body(i, W);
  if (i < n) body(i, n - i);
}

}  // namespace te_cpp::cpu
