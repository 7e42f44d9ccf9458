// Operator classes of the linear family: y = x W^T (+ bias) with its backward GEMMs and the
// fused epilogues, and the FP8 GEMM. The front end (ops/linear.cpp) checks and allocates, then
// describes each GEMM to gemm_stub; the backends run it: ATen's GEMMs (MKL or oneDNN) plus one
// epilogue pass on CPU, cuBLASLt with its epilogues on CUDA.
//
// Shapes: x [..., in], weight [out, in], y [..., out]; dy [..., out]; bias [out].
#pragma once

#include <tuple>

#include "common/backend.h"
#include "common/common.h"
#include "ops/activation.h"

namespace te_cpp {

// What a GEMM does after the product (the epilogue), in the terms of GemmArgs below.
enum class GemmEpilogue : uint8_t {
  kNone,     // D = alpha op(A) op(B) + beta C
  kBias,     // D = alpha op(A) op(B) + beta C + bias (bias broadcast over the rows of D)
  // aux = z = alpha op(A) op(B) + bias (bias optional), D = act(z): the pre-activation z is
  // kept (the activation's saved input). beta must be 0.
  kBiasAct,
  // D = alpha op(A) op(B) (+ beta C), and bgrad[i] = sum over k of op(A)[i, k] (the bias
  // gradient of a wgrad GEMM, op(A) = dy^T), in bias_dtype.
  kBiasGrad,
  // D = dact(aux) * (alpha op(A) op(B)) with aux the saved pre-activation, and bgrad[j] = the
  // column sums of D (a dgrad GEMM fused with the activation backward and dbias). No op uses
  // it yet; the CUDA selection maps it to cuBLASLt's DGELU_BGRAD.
  kDActBiasGrad,
};

// One GEMM, row-major: D[m, n] = alpha * op(A)[m, k] op(B)[k, n] + beta * C[m, n], then the
// epilogue. op(A) = A when !trans_a (A stored [m, k] with rows lda elements apart), A^T when
// trans_a (A stored [k, m], rows lda apart); the same for B ([k, n] or [n, k], ldb). C and D
// are stored [m, n] with rows ldc / ldd apart; C is read only when beta != 0 (it may be D).
// All of A, B, C, D, bias and aux are in `dtype`; the accumulation is fp32 (fp64 for fp64).
struct GemmArgs {
  at::ScalarType dtype;
  int64_t m, n, k;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc, ldd;
  double alpha, beta;
  const void* a;
  const void* b;
  const void* c;
  void* d;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  Act act = Act::GELU;         // kBiasAct, kDActBiasGrad
  const void* bias = nullptr;  // [n] (kBias, kBiasAct; null: none)
  void* aux = nullptr;         // [m, n], rows ldd apart (kBiasAct: written; kDActBiasGrad: read)
  at::ScalarType bias_dtype = at::kFloat;  // bgrad's dtype
  void* bgrad = nullptr;                   // kBiasGrad: [m]; kDActBiasGrad: [n]
};

// Runs the GEMM and its epilogue. Returns whether the activation of kBiasAct was applied: a
// backend may leave it (D untouched, aux = z complete) for the front end to run our activation
// op on aux (the CUDA backend, for activations cuBLASLt has no epilogue for).
TE_DECLARE_STUB(gemm_stub, bool(const GemmArgs&));

// FP8 GEMM with per-tensor scales, "TN": D[m, n] = (a_scale_inv * A[m, k]) (b_scale_inv *
// B[n, k])^T, A and B FP8 (uint8 buffers in the format a_fp8 / b_fp8: float8_e4m3fn or
// float8_e5m2), both contiguous with the reduction dim last (B as the column-wise copy of an
// operand TransformerEngine keeps), scale_inv pointers to one fp32 each (device memory on CUDA),
// fp32 accumulation, D contiguous in out_dtype; bias (out_dtype, n elements, or null) added to
// every row before the one rounding.
struct Fp8GemmArgs {
  int64_t m, n, k;
  at::ScalarType a_fp8, b_fp8, out_dtype;
  const void* a;
  const void* b;
  const float* a_scale_inv;
  const float* b_scale_inv;
  void* d;
  const void* bias;
};
TE_DECLARE_STUB(fp8_gemm_stub, void(const Fp8GemmArgs&));

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

// fp8_gemm(a, a_scale_inv, a_fp8_dtype, b, b_scale_inv, b_fp8_dtype, out_dtype, bias?) ->
// a b^T (+ bias): a [..., k], b [n, k] (uint8 FP8 buffers), scale_inv fp32 with one element,
// bias [n] in out_dtype, out [..., n].
struct Fp8Gemm {
  static constexpr const char* kName = "fp8_gemm";
  static void check(const Tensor& a, const Tensor& a_scale_inv, at::ScalarType a_fp8,
                    const Tensor& b, const Tensor& b_scale_inv, at::ScalarType b_fp8,
                    at::ScalarType out_dtype, const std::optional<Tensor>& bias);
  static Tensor allocate(const Tensor& a, const Tensor& b, at::ScalarType out_dtype);
};

// mxfp8_gemm(a, a_scale, a_fp8_dtype, b, b_scale, b_fp8_dtype, out_dtype) -> a b^T, TN as
// fp8_gemm with MXFP8 operands: a [..., k] and b [n, k] (uint8 FP8 buffers, blocks of 32 along
// k), a_scale [..., k / 32] and b_scale [n, k / 32] (uint8 E8M0), out [..., n].
struct Mxfp8Gemm {
  static constexpr const char* kName = "mxfp8_gemm";
  static void check(const Tensor& a, const Tensor& a_scale, at::ScalarType a_fp8,
                    const Tensor& b, const Tensor& b_scale, at::ScalarType b_fp8,
                    at::ScalarType out_dtype);
};

// The activation named by a linear_bias_act_fwd call: a stem whose activation table row has
// LINEAR set, or a ValueError naming the op.
inline Act linear_activation(const char* op, c10::string_view name) {
  return activation_by_name(op, &ActInfo::linear_bias_act, name);
}

}  // namespace te_cpp
