// Operator classes of the linear family: y = x W^T (+ bias) with its backward GEMMs and the
// fused epilogues. GEMMs are ATen's (at::mm / at::addmm: MKL or oneDNN on CPU); the only
// hand-written code is the epilogue pass.
//
// Shapes: x [..., in], weight [out, in], y [..., out]; dy [..., out]; bias [out].
#pragma once

#include <tuple>

#include "common/common.h"
#include "ops/activation.h"

namespace te_cpp {

struct LinearShapes {
  // x / weight / bias agree (dtypes equal, same device, x's last dim == weight's in_features).
  static void check_fwd(const char* op, const Tensor& x, const Tensor& weight,
                        const std::optional<Tensor>& bias);
  static Tensor allocate_out(const Tensor& x, const Tensor& weight);
  // dy against weight (dgrad) or x (wgrad).
  static void check_dgrad(const char* op, const Tensor& dy, const Tensor& weight);
  static void check_wgrad(const char* op, const Tensor& dy, const Tensor& x);
  static Tensor allocate_dgrad(const Tensor& dy, const Tensor& weight);
  // The residual operand of the fused adds: the output's shape (fwd) or the input's (dgrad).
  static void check_extra(const char* op, const Tensor& extra, const Tensor& x,
                          const Tensor& weight);
  static void check_dextra(const char* op, const Tensor& dextra, const Tensor& dy,
                           const Tensor& weight);
  // linear_fwd_add_inplace: check_extra, and extra (written in place) contiguous, with no
  // elements sharing memory, and overlapping none of x, weight, bias (a GEMM reads them while
  // extra is written).
  static void check_extra_inplace(const char* op, const Tensor& extra, const Tensor& x,
                                  const Tensor& weight, const std::optional<Tensor>& bias);
  static Tensor allocate_wgrad(const Tensor& dy, const Tensor& x);
  // linear_bwd: dy against both x and weight, and the bias dtype when dbias is asked for.
  static void check_bwd(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                        std::optional<at::ScalarType> bias_dtype);
  // dbias [out_features] in bias_dtype, or [0] (fixed arity) when no dbias is asked for.
  static Tensor allocate_dbias(const Tensor& dy, const Tensor& weight,
                               std::optional<at::ScalarType> bias_dtype);
};

// The activation named by a linear_bias_act_fwd call: a stem whose activation table row has
// LINEAR set, or a ValueError naming the op.
inline Act linear_activation(const char* op, c10::string_view name) {
  return activation_by_name(op, &ActInfo::linear_bias_act, name);
}

}  // namespace te_cpp
