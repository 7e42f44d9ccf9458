// random_seeds(like, n): the seeds of the stochastic ops (Dropout's mask, NVFP4's stochastic
// rounding), drawn from torch's default generator of like's device. The front end serves the
// CPU and CUDA dispatch keys alike: ATen's randint draws with that device's generator, as the
// Python torch.randint(0, 2**62, (n,)) does, so eager draws are unchanged by routing them
// through this op; under torch.compile the op stays opaque and draws the same values.
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <torch/library.h>

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {
namespace {

constexpr const char* kName = "random_seeds";
// Seeds are uniform in [0, 2^62): plenty of Philox keys, and a range every backend's randint
// handles.
constexpr int64_t kSeedHigh = int64_t{1} << 62;

void check(const Tensor& like, int64_t n) {
  TE_CHECK(like.defined(), kName, "like must be a tensor (it names the device)");
  TE_CHECK_VALUE(n >= 0, kName, "the number of seeds n must be >= 0, got ", n);
}

Tensor random_seeds_meta(const Tensor& like, int64_t n) {
  check(like, n);
  return at::empty({n}, like.options().dtype(at::kLong));
}

Tensor random_seeds(const Tensor& like, int64_t n) {
  check(like, n);
  const auto guard = device_guard(like);
  return at::randint(0, kSeedHigh, {n}, like.options().dtype(at::kLong));
}

void register_front_ends(torch::Library& m) { m.impl(kName, random_seeds); }

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) { m.impl(kName, random_seeds_meta); }

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
