// A small cuBLASLt wrapper for the CUDA backends: one handle per device, the workspace from
// torch's caching allocator, and the algorithm heuristics cached per problem (shape, types,
// layouts, epilogue and pointer alignments). Everything runs on the current stream of the
// current device, never synchronises the host and allocates no device memory outside the
// caching allocator (safe under CUDA graph capture).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace te_cpp::cublaslt {

// One matmul in cuBLASLt's own column-major terms: D[m, n] = alpha op(A)[m, k] op(B)[k, n]
// + beta C[m, n], then the epilogue. A is stored [m, k] (or [k, m] when trans_a), column-major
// with leading dimension lda; B, C and D likewise.
struct Matmul {
  cudaDataType_t a_type, b_type, cd_type;  // C and D share a type
  cublasComputeType_t compute;
  cudaDataType_t scale_type;  // of alpha and beta: CUDA_R_32F, or CUDA_R_64F for fp64
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  double alpha = 1.0, beta = 0.0;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // beta 0: may be null (D is passed in its place)
  void* d = nullptr;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // BIAS: the bias; BGRAD*: the bias gradient written
  cudaDataType_t bias_type = CUDA_R_32F;
  bool set_bias_type = false;  // else cuBLASLt's default (D's type)
  void* aux = nullptr;         // GELU_AUX*: z written; DGELU*: z read
  int64_t aux_ld = 0;
  const float* a_scale = nullptr;  // FP8: device pointers to A's and B's scale (inverse)
  const float* b_scale = nullptr;
};

// Runs `mm` on the current stream. Returns false, launching nothing, when cuBLASLt has no
// algorithm for it (an unsupported epilogue / type combination, or a fused epilogue that the
// heuristics reject as an invalid value, as they do for a matrix with one row or column): the
// caller then falls back. Any other cuBLASLt failure is an error.
bool run(const Matmul& mm);

// The size of one element of a cuBLASLt data type (the types the backends use).
int64_t element_size(cudaDataType_t t);

}  // namespace te_cpp::cublaslt
