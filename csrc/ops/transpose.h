// Operator class of transpose_2d: the contiguous transpose of a 2-D tensor, moved as raw
// elements of 1, 2, 4 or 8 bytes (the quantized tensors' FP8 / FP4 bytes and scales, and
// the high-precision inputs of the column-wise quantizations). The check and the
// allocation are shared by the Meta kernel and the front end (ops/transpose.cpp); the
// backends implement the stub below on contiguous buffers.
#pragma once

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {

// out[c, r] = x[r, c] for the row-major x [rows, cols] (rows, cols >= 1) and out [cols, rows],
// elements of elem_size bytes (1, 2, 4 or 8), copied bit for bit.
struct Transpose2dArgs {
  int64_t rows, cols;
  int64_t elem_size;
  const void* x;
  void* out;
};
TE_DECLARE_STUB(transpose_2d_stub, void(const Transpose2dArgs&));

// Calls f(E{}) with E the unsigned integer type of elem_size bytes (1, 2, 4 or 8, the sizes
// Transpose2d::check admits): the backends' kernels move elements as those integers.
template <typename Fn>
decltype(auto) visit_elem_type(int64_t elem_size, const Fn& f) {
  switch (elem_size) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

// transpose_2d(x) -> x.t().contiguous(): x 2-D, of any dtype of 1, 2, 4 or 8 bytes per
// element.
struct Transpose2d {
  static constexpr const char* kName = "transpose_2d";
  static void check(const Tensor& x);
  static Tensor allocate(const Tensor& x);
};

// The op's front end, for other front ends that need a contiguous transpose (the grouped
// quantize ops' column-wise copies): checks x, returns x.t().contiguous() by the backend's
// transpose_2d_stub.
Tensor transpose_2d(const Tensor& x);

}  // namespace te_cpp
