// CUDA backend of the linear family: every GEMM is cuBLASLt's (kernels/cuda/cublaslt.h), with
// the epilogue fused where cuBLASLt has one that computes what the CPU backend does, and our
// kernels after the GEMM otherwise.
//
// Epilogues (choose_epilogue, the one place they are chosen):
//   * bias: BIAS (bias broadcast over the rows of D, added in fp32 before the one rounding);
//   * GELU: GELU_AUX / GELU_AUX_BIAS for bf16 and fp16, the pre-activation z written through
//     the aux pointer. cuBLASLt's GELU is the tanh approximation, TransformerEngine's GELU (and
//     ours); it is applied to the fp32 z, where the CPU backend applies it to z rounded to the
//     dtype (an ulp of the dtype apart at most, within the conformance tolerances). cuBLASLt
//     does not document how it evaluates tanh: an approximate tanh would not show at bf16 /
//     fp16 precision but could at fp32's, so fp32 (and fp64) run BIAS + our GELU op instead;
//   * ReLU and the other activations: BIAS writing z, then our activation op on z (RELU_AUX's
//     aux is a bit-mask, not the z that linear_bias_act_fwd returns);
//   * dbias of the wgrad GEMM: BGRADB (alpha 1 and dbias in the GEMM's dtype; else our column
//     sums). DGELU_BGRAD serves GemmEpilogue::kDActBiasGrad (no op uses it yet); DRELU_BGRAD
//     would need a ReLU bit-mask aux, which no op keeps, so it is not selected.
// When cuBLASLt has no algorithm with the chosen epilogue (an epilogue / type combination it
// lacks, or a matrix with one row or column, which its heuristics reject for fused epilogues),
// the GEMM runs with DEFAULT and our kernels do the rest.
//
// Compute types: fp32 accumulation for fp32 (CUBLAS_COMPUTE_32F: no TF32, as the CPU GEMMs),
// bf16 and fp16; fp64 for fp64.
#include <algorithm>

#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/launch.cuh"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace te_cpp {
namespace {

struct Types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

Types types_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return {CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case at::kDouble:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case at::kBFloat16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case at::kHalf:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      TORCH_CHECK(false, "te_cpp: the CUDA GEMM has no dtype ", t);
  }
}

// What cuBLASLt computes of a GemmArgs, and what is left to our kernels.
struct Plan {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* out = nullptr;               // where the GEMM writes D
  const void* epi_bias = nullptr;    // BIAS: the bias; BGRAD: the bias gradient
  void* aux = nullptr;               // GELU_AUX: z; DGELU: z read
  bool bias_left = false;            // our bias kernel on `out`
  bool bgrad_left = false;           // our column sums for bgrad
  bool act_done = true;              // false: the front end runs the activation op on aux
};

// The one function choosing cuBLASLt's epilogue. fused false: DEFAULT, all else ours.
Plan choose_epilogue(const GemmArgs& g, bool fused) {
  Plan p;
  p.out = g.d;
  switch (g.epilogue) {
    case GemmEpilogue::kNone:
      return p;
    case GemmEpilogue::kBias:
      if (fused) {
        p.epilogue = CUBLASLT_EPILOGUE_BIAS;
        p.epi_bias = g.bias;
      } else {
        p.bias_left = true;
      }
      return p;
    case GemmEpilogue::kBiasAct: {
      // GELU_AUX: bf16 / fp16 only (see the top of the file), and its aux buffer needs a
      // leading dimension divisible by 8
      const bool half = g.dtype == at::kBFloat16 || g.dtype == at::kHalf;
      const bool gelu_aux = g.act == Act::GELU && half && g.ldd % 8 == 0;
      if (fused && gelu_aux) {
        p.epilogue =
            g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        p.epi_bias = g.bias;
        p.aux = g.aux;
        return p;
      }
      p.out = g.aux;  // the GEMM writes z; the activation op makes y from it
      p.act_done = false;
      if (g.bias != nullptr) {
        if (fused) {
          p.epilogue = CUBLASLT_EPILOGUE_BIAS;
          p.epi_bias = g.bias;
        } else {
          p.bias_left = true;
        }
      }
      return p;
    }
    case GemmEpilogue::kBiasGrad:
      // BGRADB sums cuBLASLt's B = our op(A) over k, unscaled: right for alpha 1 only
      if (fused && g.alpha == 1.0 && g.bias_dtype == g.dtype) {
        p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        p.epi_bias = g.bgrad;
      } else {
        p.bgrad_left = true;
      }
      return p;
    case GemmEpilogue::kDActBiasGrad:
      TORCH_CHECK(fused && g.act == Act::GELU && g.ldd % 8 == 0,
                  "te_cpp: the dact + dbias GEMM epilogue (DGELU_BGRAD) needs GELU, a dtype "
                  "with fused epilogues and a leading dimension that is a multiple of 8; got ",
                  kActInfo[static_cast<int>(g.act)].stem, ", ", g.dtype, ", ", g.ldd);
      p.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      p.epi_bias = g.bgrad;
      p.aux = g.aux;
      return p;
  }
  TORCH_CHECK(false, "te_cpp: unknown GEMM epilogue ", static_cast<int>(g.epilogue));
}

// The GemmArgs (row-major) as cuBLASLt's column-major matmul: D^T = op(B)^T op(A)^T, so
// cuBLASLt's A is our B and its B our A, with m and n swapped.
bool run_plan(const GemmArgs& g, const Plan& p) {
  const Types t = types_of(g.dtype);
  cublaslt::Matmul mm;
  mm.a_type = mm.b_type = mm.cd_type = t.data;
  mm.compute = t.compute;
  mm.scale_type = t.scale;
  mm.trans_a = g.trans_b, mm.trans_b = g.trans_a;
  mm.m = g.n, mm.n = g.m, mm.k = g.k;
  mm.lda = g.ldb, mm.ldb = g.lda, mm.ldc = g.ldc, mm.ldd = g.ldd;
  mm.alpha = g.alpha, mm.beta = g.beta;
  mm.a = g.b, mm.b = g.a, mm.c = g.c, mm.d = p.out;
  mm.epilogue = p.epilogue;
  mm.bias = p.epi_bias;
  if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB || p.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    mm.bias_type = types_of(g.bias_dtype).data;
    mm.set_bias_type = true;
  }
  mm.aux = p.aux;
  mm.aux_ld = p.aux != nullptr ? g.ldd : 0;
  return cublaslt::run(mm);
}

// out[r, j] += bias[j] over an [m, n] matrix with rows ld apart (in place: not __restrict__;
// each element is read and written by one thread).
template <typename T>
__global__ void bias_rows_kernel(T* out, const T* __restrict__ bias, int64_t m, int64_t n,
                                 int64_t ld) {
  const int64_t total = m * n;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t r = i / n, j = i - r * n;
    T* o = out + r * ld + j;
    *o = static_cast<T>(static_cast<Acc<T>>(*o) + static_cast<Acc<T>>(bias[j]));
  }
}

// bias_rows_kernel on the current stream, over out and bias of one float dtype.
void add_bias_rows(at::ScalarType dtype, void* out, const void* bias, int64_t m, int64_t n,
                   int64_t ld) {
  TE_DISPATCH_FLOAT(dtype, "bias_rows", [&] {
    using T = scalar_t;
    bias_rows_kernel<T><<<blocks_for(m * n), kThreads, 0, current_stream()>>>(
        static_cast<T*>(out), static_cast<const T*>(bias), m, n, ld);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// The product of an empty reduction (k = 0): out = beta C (+ bias), rows ld apart.
template <typename T>
__global__ void empty_product_kernel(T* out, const T* c, Acc<T> beta, const T* __restrict__ bias,
                                     int64_t m, int64_t n, int64_t ldc, int64_t ld) {
  const int64_t total = m * n;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t r = i / n, j = i - r * n;
    Acc<T> v = c != nullptr ? beta * static_cast<Acc<T>>(c[r * ldc + j]) : Acc<T>(0);
    if (bias != nullptr) v += static_cast<Acc<T>>(bias[j]);
    out[r * ld + j] = static_cast<T>(v);
  }
}

bool gemm_empty_k(const GemmArgs& g) {
  TORCH_CHECK(g.epilogue != GemmEpilogue::kDActBiasGrad,
              "te_cpp: the CUDA GEMM has no dact epilogue for k = 0");
  const bool act = g.epilogue == GemmEpilogue::kBiasAct;
  const bool with_bias = g.epilogue == GemmEpilogue::kBias || act;
  void* out = act ? g.aux : g.d;
  const int64_t total = g.m * g.n;
  TE_DISPATCH_FLOAT(g.dtype, "linear", [&] {
    using T = scalar_t;
    empty_product_kernel<T><<<blocks_for(total), kThreads, 0, current_stream()>>>(
        static_cast<T*>(out), g.beta != 0.0 ? static_cast<const T*>(g.c) : nullptr,
        static_cast<Acc<T>>(g.beta), with_bias ? static_cast<const T*>(g.bias) : nullptr, g.m,
        g.n, g.ldc, g.ldd);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  if (g.epilogue == GemmEpilogue::kBiasGrad) {
    // the sum over no rows
    const int64_t bytes = g.m * static_cast<int64_t>(c10::elementSize(g.bias_dtype));
    C10_CUDA_CHECK(cudaMemsetAsync(g.bgrad, 0, static_cast<size_t>(bytes), current_stream()));
  }
  return !act;  // the activation op runs on z
}

bool gemm_cuda(const GemmArgs& g) {
  if (g.k == 0) return gemm_empty_k(g);
  Plan p = choose_epilogue(g, /*fused=*/true);
  if (!run_plan(g, p)) {
    p = choose_epilogue(g, /*fused=*/false);
    TORCH_CHECK(run_plan(g, p), "te_cpp: cuBLASLt has no algorithm for a ", g.dtype, " GEMM (m ",
                g.m, ", n ", g.n, ", k ", g.k, ")");
  }
  if (p.bias_left) add_bias_rows(g.dtype, p.out, g.bias, g.m, g.n, g.ldd);
  if (p.bgrad_left) {
    // bgrad = the row sums of op(A) = dy^T: the column sums of the stored, contiguous dy
    TORCH_INTERNAL_ASSERT(g.trans_a && g.lda == g.m, "gemm_cuda: kBiasGrad needs A = dy^T");
    column_sum_stub(c10::DeviceType::CUDA,
                    ColumnSumArgs{g.dtype, g.bias_dtype, g.k, g.m, g.a, g.bgrad});
  }
  return p.act_done;
}

// ---- FP8 ----

cudaDataType_t fp8_type(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

void fp8_gemm_cuda(const Fp8GemmArgs& f) {
  const char* op = Fp8Gemm::kName;
  TE_CHECK(f.out_dtype != at::kDouble, op,
           "cuBLASLt's FP8 GEMM writes float32, bfloat16 or float16, got out_dtype float64");
  TE_CHECK(!(f.a_fp8 == at::kFloat8_e5m2 && f.b_fp8 == at::kFloat8_e5m2), op,
           "cuBLASLt has no FP8 GEMM with both operands float8_e5m2 (one must be e4m3)");
  TE_CHECK(f.k % 16 == 0 && f.n % 16 == 0, op,
           "the FP8 GEMM needs k and n (the leading dimensions) to be multiples of 16, got m ",
           f.m, ", n ", f.n, ", k ", f.k);
  TE_CHECK(aligned(f.a) && aligned(f.b) && aligned(f.d), op,
           "the FP8 GEMM needs 16-byte aligned operands (m ", f.m, ", n ", f.n, ", k ", f.k,
           ")");
  if (f.k == 0) {
    const size_t bytes = static_cast<size_t>(f.m * f.n) * c10::elementSize(f.out_dtype);
    C10_CUDA_CHECK(cudaMemsetAsync(f.d, 0, bytes, current_stream()));
    if (f.bias != nullptr) add_bias_rows(f.out_dtype, f.d, f.bias, f.m, f.n, f.n);
    return;
  }
  // TN: cuBLASLt's A is our b [n, k] read transposed, its B our a [m, k]; both have k
  // contiguous, the layout Hopper's FP8 GEMMs require.
  cublaslt::Matmul mm;
  mm.a_type = fp8_type(f.b_fp8);
  mm.b_type = fp8_type(f.a_fp8);
  mm.cd_type = types_of(f.out_dtype).data;
  mm.compute = CUBLAS_COMPUTE_32F;
  mm.scale_type = CUDA_R_32F;
  mm.trans_a = true, mm.trans_b = false;
  mm.m = f.n, mm.n = f.m, mm.k = f.k;
  mm.lda = f.k, mm.ldb = f.k, mm.ldc = f.n, mm.ldd = f.n;
  mm.a = f.b, mm.b = f.a, mm.d = f.d;
  mm.a_scale = f.b_scale_inv;
  mm.b_scale = f.a_scale_inv;
  if (f.bias != nullptr) {  // the bias epilogue, in D's type, before the one rounding
    cublaslt::Matmul with_bias = mm;
    with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
    with_bias.bias = f.bias;
    with_bias.bias_type = mm.cd_type;
    with_bias.set_bias_type = true;
    if (cublaslt::run(with_bias)) return;
  }
  TE_CHECK(cublaslt::run(mm), op, "cuBLASLt has no FP8 algorithm for m ", f.m, ", n ", f.n,
           ", k ", f.k, " (", f.a_fp8, " x ", f.b_fp8, " -> ", f.out_dtype, ")");
  // the bias by our kernel where cuBLASLt did not take it as an epilogue
  if (f.bias != nullptr) add_bias_rows(f.out_dtype, f.d, f.bias, f.m, f.n, f.n);
}

}  // namespace

TE_REGISTER_KERNEL(gemm_stub, CUDA, gemm_cuda);
TE_REGISTER_KERNEL(fp8_gemm_stub, CUDA, fp8_gemm_cuda);

}  // namespace te_cpp
