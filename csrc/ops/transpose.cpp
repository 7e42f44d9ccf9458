// Checks, allocation, Meta kernel and front end of transpose_2d.
#include "ops/transpose.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace te_cpp {

void Transpose2d::check(const Tensor& x) {
  TE_CHECK(x.defined(), kName, "input is undefined");
  TE_CHECK(x.dim() == 2, kName, "input must be 2-D, got shape ", shape_str(x));
  const int64_t size = x.element_size();
  TE_CHECK(size == 1 || size == 2 || size == 4 || size == 8, kName,
           "input's dtype must have 1, 2, 4 or 8 bytes per element, got ", x.scalar_type(), " (",
           size, " bytes) of shape ", shape_str(x));
}

Tensor Transpose2d::allocate(const Tensor& x) {
  return at::empty_symint({x.sym_size(1), x.sym_size(0)}, x.options());
}

TE_DEFINE_STUB(transpose_2d_stub, void(const Transpose2dArgs&));

// ---- front end (the CPU and CUDA dispatch keys) ----

Tensor transpose_2d(const Tensor& x_in) {
  Transpose2d::check(x_in);
  const auto guard = device_guard(x_in);
  Tensor out = Transpose2d::allocate(x_in);
  if (out.numel() == 0) return out;
  const Tensor x = x_in.contiguous();
  transpose_2d_stub(x.device().type(),
                    Transpose2dArgs{x.size(0), x.size(1), x.element_size(), x.const_data_ptr(),
                                    out.mutable_data_ptr()});
  return out;
}

namespace {

void register_front_ends(torch::Library& m) { m.impl("transpose_2d", transpose_2d); }

// ---- Meta kernel ----

Tensor transpose_2d_meta(const Tensor& x) {
  Transpose2d::check(x);
  return Transpose2d::allocate(x);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) { m.impl("transpose_2d", transpose_2d_meta); }

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
