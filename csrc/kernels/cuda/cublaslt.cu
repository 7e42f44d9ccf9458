// The cuBLASLt wrapper (kernels/cuda/cublaslt.h).
#include <c10/cuda/CUDAFunctions.h>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/launch.cuh"

namespace te_cpp::cublaslt {
namespace {

#define TE_CUBLASLT_CHECK(expr, what)                                                      \
  do {                                                                                   \
    const cublasStatus_t te_status_ = (expr);                                            \
    TORCH_CHECK(te_status_ == CUBLAS_STATUS_SUCCESS, "te_cpp: cuBLASLt ", what, ": ",    \
                cublasLtGetStatusString(te_status_));                                    \
  } while (0)

// The workspace the heuristics may ask for: 32 MiB, as TransformerEngine gives its Hopper GEMMs.
constexpr uint64_t kMaxWorkspaceBytes = uint64_t{32} << 20;

// One handle per device, created on first use and kept for the process (destroying it at exit
// could race the CUDA runtime's own teardown).
cublasLtHandle_t handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (handles.empty()) handles.resize(c10::cuda::device_count(), nullptr);
  TORCH_CHECK(device >= 0 && device < static_cast<int>(handles.size()),
              "te_cpp: cuBLASLt: bad device index ", device);
  if (handles[device] == nullptr) {
    TE_CUBLASLT_CHECK(cublasLtCreate(&handles[device]), "cublasLtCreate");
  }
  return handles[device];
}

// The largest power of two (up to 256) dividing the address: what the heuristics must assume.
uint32_t alignment(const void* p) {
  if (p == nullptr) return 256;
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// The heuristics' cache key: everything the algorithm choice depends on except the addresses
// themselves (their alignments instead).
struct Key {
  std::array<int64_t, 27> v;
  bool operator==(const Key& o) const { return v == o.v; }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (const int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// C as cublasLtMatmul reads it: D in its place when beta is 0.
const void* c_operand(const Matmul& mm) { return mm.beta != 0.0 ? mm.c : mm.d; }

Key key_of(const Matmul& mm, int device) {
  return Key{{device, mm.a_type, mm.b_type, mm.cd_type, mm.compute, mm.scale_type, mm.trans_a,
              mm.trans_b, mm.m, mm.n, mm.k, mm.lda, mm.ldb, mm.ldc, mm.ldd, mm.beta != 0.0,
              mm.epilogue, mm.set_bias_type ? mm.bias_type : -1, mm.aux_ld,
              mm.a_scale != nullptr, alignment(mm.a), alignment(mm.b),
              alignment(c_operand(mm)), alignment(mm.d), alignment(mm.bias),
              alignment(mm.aux), 0}};
}

struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// RAII owners of the descriptors (created per call: they carry this call's pointers).
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using DescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using PrefPtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  TE_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(T)),
                    "cublasLtMatmulDescSetAttribute");
}

LayoutPtr layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  TE_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                               static_cast<uint64_t>(cols), ld),
                    "cublasLtMatrixLayoutCreate");
  return LayoutPtr(l);
}

Choice find_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                 cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                 const Matmul& mm) {
  cublasLtMatmulPreference_t p = nullptr;
  TE_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&p), "cublasLtMatmulPreferenceCreate");
  PrefPtr pref(p);
  const auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    TE_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)),
                      "cublasLtMatmulPreferenceSetAttribute");
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMaxWorkspaceBytes);
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(mm.a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(mm.b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(c_operand(mm)));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(mm.d));
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, d, p, 1, &result, &count);
  Choice choice;
  if (st == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    choice.found = true;
    choice.algo = result.algo;
    choice.workspace = result.workspaceSize;
  } else {
    // No algorithm: the caller falls back. cuBLASLt says so with NOT_SUPPORTED, but for a fused
    // epilogue on a matrix with one row or column the heuristics answer INVALID_VALUE instead
    // (PyTorch's addmm keeps such shapes off its cuBLASLt bias path for this reason), so that
    // too is "no algorithm" when the epilogue is not DEFAULT. Anything else is a bug.
    const bool fused = mm.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
    TORCH_CHECK(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED ||
                    (fused && st == CUBLAS_STATUS_INVALID_VALUE),
                "te_cpp: cuBLASLt cublasLtMatmulAlgoGetHeuristic: ", cublasLtGetStatusString(st));
  }
  return choice;
}

}  // namespace

int64_t element_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_64F:
      return 8;
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 1;
  }
}

bool run(const Matmul& mm) {
  const int device = c10::cuda::current_device();
  const cublasLtHandle_t h = handle(device);

  cublasLtMatmulDesc_t raw_desc = nullptr;
  TE_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, mm.compute, mm.scale_type),
                    "cublasLtMatmulDescCreate");
  DescPtr desc(raw_desc);
  set_attr(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<int32_t>(mm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_attr(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<int32_t>(mm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_attr(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(mm.epilogue));
  if (mm.bias != nullptr) set_attr(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, mm.bias);
  if (mm.set_bias_type) {
    set_attr(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(mm.bias_type));
  }
  if (mm.aux != nullptr) {
    set_attr(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, mm.aux);
    set_attr(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, mm.aux_ld);
  }
  if (mm.a_scale != nullptr) {
    set_attr(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, mm.a_scale);
    set_attr(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, mm.b_scale);
  }

  const LayoutPtr la = mm.trans_a ? layout(mm.a_type, mm.k, mm.m, mm.lda)
                                  : layout(mm.a_type, mm.m, mm.k, mm.lda);
  const LayoutPtr lb = mm.trans_b ? layout(mm.b_type, mm.n, mm.k, mm.ldb)
                                  : layout(mm.b_type, mm.k, mm.n, mm.ldb);
  const void* c = c_operand(mm);
  const LayoutPtr lc = layout(mm.cd_type, mm.m, mm.n, mm.beta != 0.0 ? mm.ldc : mm.ldd);
  const LayoutPtr ld = layout(mm.cd_type, mm.m, mm.n, mm.ldd);

  // the heuristics run once per problem; later calls reuse their answer
  static std::mutex cache_mutex;
  static std::unordered_map<Key, Choice, KeyHash> cache;
  const Key key = key_of(mm, device);
  Choice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) choice = it->second, cached = true;
  }
  if (!cached) {
    choice = find_algo(h, raw_desc, la.get(), lb.get(), lc.get(), ld.get(), mm);
    std::lock_guard<std::mutex> lock(cache_mutex);
    cache.emplace(key, choice);
  }
  if (!choice.found) return false;

  const Workspace workspace(static_cast<int64_t>(choice.workspace));
  const float alpha_f = static_cast<float>(mm.alpha), beta_f = static_cast<float>(mm.beta);
  const bool fp64 = mm.scale_type == CUDA_R_64F;
  const void* alpha = fp64 ? static_cast<const void*>(&mm.alpha) : &alpha_f;
  const void* beta = fp64 ? static_cast<const void*>(&mm.beta) : &beta_f;
  TE_CUBLASLT_CHECK(cublasLtMatmul(h, raw_desc, alpha, mm.a, la.get(), mm.b, lb.get(), beta, c,
                                   lc.get(), mm.d, ld.get(), &choice.algo, workspace.get(),
                                   choice.workspace, current_stream()),
                    "cublasLtMatmul");
  return true;
}

}  // namespace te_cpp::cublaslt
