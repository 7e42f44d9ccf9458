// Operator classes of Dropout (training): y = x * mask / (1 - p).
//
// dropout_fwd(x, seed, p) -> (y, mask): mask is a fresh uint8 tensor of x's shape holding 1 for
// the kept elements and 0 for the dropped ones. It is a pure function of (seed, element index):
// element i of the row-major flattened x is kept iff
//     philox4x32_10(key = seed, counter = (i / 4, 0))[i % 4] >= round(p * 2^32),
// so each element is kept with probability 1 - p, and the result depends neither on the thread
// count nor on the device. `seed` is a one-element int64 tensor on x's device; the Python op
// draws it from torch's generator (torch.manual_seed makes runs reproducible).
// dropout_bwd(dy, mask, p) -> dx = dy * mask / (1 - p).
// The scale 1 / (1 - p) is computed in double and rounded once to the accumulation type.
// The operator classes own the checks and allocation (shared by the Meta kernels and the front
// end, ops/dropout.cpp); the rule that decides the mask is common/dropout_math.h's, shared by
// the backends, which implement the stubs below on contiguous buffers.
#pragma once

#include <tuple>

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {

// y[i] = x[i] * (keep_i ? scale : 0) in the accumulation type, mask[i] = keep_i, over n > 0
// elements; keep_i = dropout::keep(draw of element i under the seed *seed, threshold). The
// seed is read by the kernel (device memory on CUDA: no host round trip).
struct DropoutFwdArgs {
  at::ScalarType dtype;
  int64_t n;
  const void* x;
  const int64_t* seed;
  uint64_t threshold;
  double scale;
  void* y;
  uint8_t* mask;
};
TE_DECLARE_STUB(dropout_fwd_stub, void(const DropoutFwdArgs&));

// dx[i] = dy[i] * (mask[i] != 0 ? scale : 0) in the accumulation type, over n > 0 elements.
struct DropoutBwdArgs {
  at::ScalarType dtype;
  int64_t n;
  const void* dy;
  const uint8_t* mask;
  double scale;
  void* dx;
};
TE_DECLARE_STUB(dropout_bwd_stub, void(const DropoutBwdArgs&));

struct DropoutFwd {
  static constexpr const char* kName = "dropout_fwd";
  static void check(const Tensor& x, const Tensor& seed, double p);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x);  // (y, mask)
};

struct DropoutBwd {
  static constexpr const char* kName = "dropout_bwd";
  static void check(const Tensor& dy, const Tensor& mask, double p);
  static Tensor allocate(const Tensor& dy);  // dx
};

// p must be in [0, 1).
void check_dropout_probability(const char* op, double p);

}  // namespace te_cpp
