// Operator classes of the grouped family: GroupedLinear's GEMMs (one weight per group of
// consecutive rows, TransformerEngine's GroupedLinear) and its bias parts. The front end
// (ops/grouped.cpp) checks, allocates and reads the split sizes on the host, then describes
// the per-group GEMMs (the linear family's GemmArgs) to grouped_gemm_stub and the bias work
// to the stubs below.
//
// Shapes: x [T, in]; split_sizes int64 [G], values >= 0 summing to T, group g owning rows
// [offset_g, offset_g + split_sizes[g]); weights G x [out, in]; biases none or G x [out];
// bias_scales none or [T] (float32 or x's dtype); y and dy [T, out].
#pragma once

#include <c10/util/ArrayRef.h>

#include <tuple>
#include <vector>

#include "common/backend.h"
#include "common/common.h"
#include "ops/linear.h"

namespace te_cpp {

// Runs each GEMM of `gemms` (epilogues kNone or kBias only), writing disjoint outputs. The CPU
// backend runs many small GEMMs in parallel over the groups; the CUDA backend runs them one
// after the other on the current stream.
TE_DECLARE_STUB(grouped_gemm_stub, void(c10::ArrayRef<GemmArgs>));

// In place over y [T, features]: y[t, :] += s[t] * bias_g[:] for the rows t of group g (rows
// offsets[g] .. offsets[g + 1]), in the accumulation type with one rounding to dtype; y and
// the biases in dtype, the scales in scale_dtype.
struct GroupedScaledBiasArgs {
  at::ScalarType dtype, scale_dtype;
  int64_t features;
  c10::ArrayRef<int64_t> offsets;     // G + 1 row offsets, host memory
  c10::ArrayRef<const void*> biases;  // G pointers to [features]
  const void* scales;                 // [T]
  void* y;
};
TE_DECLARE_STUB(grouped_scaled_bias_stub, void(const GroupedScaledBiasArgs&));

// The bias backward of a grouped linear over dy [T, features] (dtype):
//   dbias_g[j] = sum over the rows t of group g of s[t] * dy[t, j] (s = 1 without scales), in
//     the accumulation type in an order fixed by the shape, rounded once to bias_dtype; zeros
//     for an empty group;
//   with scales: dscales[t] = sum over j of dy[t, j] * bias_g[j], rounded to scale_dtype.
struct GroupedBiasBwdArgs {
  at::ScalarType dtype, bias_dtype, scale_dtype;
  int64_t features;
  c10::ArrayRef<int64_t> offsets;      // G + 1 row offsets, host memory
  const void* dy;
  const void* scales;                  // [T], or null
  c10::ArrayRef<void*> dbiases;        // G outputs [features] in bias_dtype
  c10::ArrayRef<const void*> biases;   // G x [features] in dtype (read when scales is set)
  void* dscales;                       // [T] in scale_dtype (when scales is set)
};
TE_DECLARE_STUB(grouped_bias_bwd_stub, void(const GroupedBiasBwdArgs&));

// Checks and allocation shared by the Meta kernels and the front end. The output shapes depend
// on the argument shapes only, never on the split values.
struct GroupedLinear {
  // grouped_linear_fwd(x, split_sizes, weights, biases, bias_scales) -> y [T, out]
  static void check_fwd(const char* op, const Tensor& x, const Tensor& split_sizes,
                        at::TensorList weights, at::TensorList biases,
                        const std::optional<Tensor>& bias_scales);
  static Tensor allocate_fwd(const Tensor& x, at::TensorList weights);
  // grouped_linear_dgrad(dy, split_sizes, weights) -> dx [T, in]
  static void check_dgrad(const char* op, const Tensor& dy, const Tensor& split_sizes,
                          at::TensorList weights);
  static Tensor allocate_dgrad(const Tensor& dy, at::TensorList weights);
  // grouped_linear_wgrad(dy, x, split_sizes) -> G x dW [out, in]
  static void check_wgrad(const char* op, const Tensor& dy, const Tensor& x,
                          const Tensor& split_sizes);
  static std::vector<Tensor> allocate_wgrad(const Tensor& dy, const Tensor& x,
                                            const Tensor& split_sizes);
  // grouped_bias_bwd(dy, split_sizes, biases, bias_scales, bias_dtype) -> (G x dbias [out],
  // dscales [T] or [0])
  static void check_bias_bwd(const char* op, const Tensor& dy, const Tensor& split_sizes,
                             at::TensorList biases, const std::optional<Tensor>& bias_scales,
                             at::ScalarType bias_dtype);
  static std::tuple<std::vector<Tensor>, Tensor> allocate_bias_bwd(
      const Tensor& dy, const Tensor& split_sizes, const std::optional<Tensor>& bias_scales,
      at::ScalarType bias_dtype);

  // The number of groups G of split_sizes (1-D int64 with at least one element, else an error).
  static int64_t num_groups(const char* op, const Tensor& split_sizes);
  // The real kernels only: split_sizes read on the host (a device tensor is copied: one
  // synchronisation), checked (>= 0, summing to `rows`, the row count of the tensor named
  // `rows_name`), as G + 1 row offsets.
  static std::vector<int64_t> row_offsets(const char* op, const Tensor& split_sizes,
                                          int64_t rows, const char* rows_name);
};

// Checks and allocation of the per-group quantize ops (GroupedLinear under a recipe): x
// [T, K]; FP8 scale_inv / amax / scales float32 [G]; MXFP8 buffers as mxfp8_quantize's, the
// columnwise ones of x^T [K, T]. Float8BlockScaling and NVFP4 take one call per copy
// (`columnwise`: the copy of each group's transpose, data [K, T] with group g in columns
// offset_g ..); their scale layouts are in registration.cpp.
struct GroupedQuantize {
  static void check_fp8(const char* op, const Tensor& x, const Tensor& split_sizes,
                        const std::optional<Tensor>& scales, at::ScalarType fp8_dtype,
                        c10::ArrayRef<double> amax_epsilons);
  static std::tuple<Tensor, Tensor, Tensor> allocate_fp8(const Tensor& x,
                                                         const Tensor& split_sizes);
  static void check_fp8_dequantize(const char* op, const Tensor& data, const Tensor& split_sizes,
                                   const Tensor& scale_inv, at::ScalarType fp8_dtype,
                                   at::ScalarType dtype);
  static void check_fp8_linear_fwd(const char* op, const Tensor& x, const Tensor& x_scale_inv,
                                   at::ScalarType x_fp8, const Tensor& split_sizes,
                                   at::TensorList weights, at::TensorList weight_scale_invs,
                                   at::ScalarType w_fp8, at::TensorList biases,
                                   const std::optional<Tensor>& bias_scales,
                                   at::ScalarType out_dtype);
  static void check_mxfp8(const char* op, const Tensor& x, const Tensor& split_sizes,
                          at::ScalarType fp8_dtype, bool rowwise, bool columnwise);
  static std::tuple<Tensor, Tensor, Tensor, Tensor> allocate_mxfp8(const Tensor& x, bool rowwise,
                                                                   bool columnwise);
  static void check_fp8_block(const char* op, const Tensor& x, const Tensor& split_sizes,
                              at::ScalarType fp8_dtype, int64_t block_dim, double amax_epsilon);
  static std::tuple<Tensor, Tensor> allocate_fp8_block(const Tensor& x,
                                                       const Tensor& split_sizes,
                                                       int64_t block_dim, bool columnwise);
  // the scale_inv shape of grouped_fp8_block_quantize's copy of a [T, K] input (T and K
  // swapped in `data` for the columnwise copy)
  static c10::SymDimVector fp8_block_scale_sizes(const c10::SymInt& rows, const c10::SymInt& cols,
                                                 int64_t groups, int64_t block_dim,
                                                 bool columnwise);
  static void check_fp8_block_dequantize(const char* op, const Tensor& data,
                                         const Tensor& split_sizes, const Tensor& scale_inv,
                                         at::ScalarType fp8_dtype, int64_t block_dim,
                                         bool columnwise, at::ScalarType dtype);
  static void check_nvfp4(const char* op, const Tensor& x, const Tensor& split_sizes,
                          bool columnwise, const std::optional<Tensor>& sr_seeds);
  static std::tuple<Tensor, Tensor, Tensor> allocate_nvfp4(const Tensor& x,
                                                           const Tensor& split_sizes,
                                                           bool columnwise);
  static void check_nvfp4_dequantize(const char* op, const Tensor& data,
                                     const Tensor& split_sizes, const Tensor& scale,
                                     const Tensor& amax, at::ScalarType dtype);
};

// The backends' dispatch on the bias scales' type: calls f with a null S* for S = float or
// the data type T (the only two the checks let through).
template <typename T, typename F>
void with_scale_type(at::ScalarType scale_dtype, const F& f) {
  if (scale_dtype == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    TORCH_INTERNAL_ASSERT(scale_dtype == c10::CppTypeToScalarType<T>::value,
                          "grouped: bias_scales dtype ", scale_dtype);
    f(static_cast<T*>(nullptr));
  }
}

}  // namespace te_cpp
