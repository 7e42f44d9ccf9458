// Operator classes of the normalisation family: LayerNorm and RMSNorm, forward and backward,
// and the fused RMSNorm backward that adds the residual branch's gradient (BackwardAddRMSNorm).
//
// x is normalised over its trailing dims matching weight's shape (weight.numel() = features);
// the leading dims are rows. The statistics (mean, rstd) have the leading dims' shape and the
// accumulation dtype: float32 for fp32/bf16/fp16 inputs, float64 for fp64. With
// zero_centered_gamma the scale is (1 + weight).
//
// The operator classes own the checks and the allocation (shared by the Meta kernels and the
// front end, ops/normalization.cpp); the backends implement norm_fwd_stub and norm_bwd_stub on
// contiguous buffers: x, dy, dextra, weight, bias, y, dx, dweight and dbias in one dtype, the
// statistics in its accumulation type.
#pragma once

#include <tuple>

#include "common/backend.h"
#include "common/common.h"

namespace te_cpp {

enum class NormKind { kLayerNorm, kRMSNorm };

// Forward over rows x features: per row the statistics (mean for LayerNorm, rstd), and
// y = xhat * gamma (+ beta), gamma = weight (+ 1 with zero_centered_gamma). features may be 0
// (rows of an empty sum: the statistics are then NaN, y empty).
struct NormFwdArgs {
  NormKind kind;
  at::ScalarType dtype;
  int64_t rows, features;
  double eps;
  bool zero_centered_gamma;
  const void* x;
  const void* weight;
  const void* bias;  // LayerNorm only
  void* y;
  void* mean;  // LayerNorm only, [rows] in the accumulation type
  void* rstd;  // [rows] in the accumulation type
};
TE_DECLARE_STUB(norm_fwd_stub, void(const NormFwdArgs&));

// Backward over rows x features, rows >= 1 and features >= 1: dx (+ dextra for
// BackwardAddRMSNorm), and dweight (and dbias for LayerNorm) summed over the rows in an order
// fixed by the shape alone (bitwise deterministic), rounded once to dtype.
struct NormBwdArgs {
  NormKind kind;
  at::ScalarType dtype;
  int64_t rows, features;
  bool zero_centered_gamma;
  const void* dy;
  const void* x;
  const void* mean;  // LayerNorm only
  const void* rstd;
  const void* weight;
  const void* dextra;  // RMSNorm only, or null
  void* dx;
  void* dweight;
  void* dbias;  // LayerNorm only
};
TE_DECLARE_STUB(norm_bwd_stub, void(const NormBwdArgs&));

struct NormShapes {
  // Checks x against weight (and bias, when defined): dtypes, devices, trailing shape.
  static void check(const char* op, const Tensor& x, const Tensor& weight, const Tensor* bias);
  // Shape of the per-row statistics: x's leading dims.
  static c10::SymDimVector stat_shape(const Tensor& x, const Tensor& weight);
  static at::ScalarType stat_dtype(const Tensor& x);
  static Tensor allocate_stat(const Tensor& x, const Tensor& weight);
  static void check_stat(const char* op, const char* name, const Tensor& stat, const Tensor& x,
                         const Tensor& weight);
  static void check_eps(const char* op, double eps);
};

// layernorm_fwd(x, weight, bias, eps, zero_centered_gamma) -> (y, mean, rstd)
struct LayerNormFwd {
  static constexpr const char* kName = "layernorm_fwd";
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x, const Tensor& weight);
};

// layernorm_bwd(dy, x, mean, rstd, weight, zero_centered_gamma) -> (dx, dweight, dbias)
struct LayerNormBwd {
  static constexpr const char* kName = "layernorm_bwd";
  static void check(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight);
  static std::tuple<Tensor, Tensor, Tensor> allocate(const Tensor& x, const Tensor& weight);
};

// rmsnorm_fwd(x, weight, eps, zero_centered_gamma) -> (y, rstd)
struct RMSNormFwd {
  static constexpr const char* kName = "rmsnorm_fwd";
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, const Tensor& weight);
};

// rmsnorm_bwd(dy, x, rstd, weight, zero_centered_gamma) -> (dx, dweight)
// rmsnorm_bwd_add(dy, x, rstd, weight, zero_centered_gamma, dextra) -> (dx + dextra, dweight)
struct RMSNormBwd {
  static void check(const char* op, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                    const Tensor& weight, const Tensor* dextra);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, const Tensor& weight);
};

}  // namespace te_cpp
