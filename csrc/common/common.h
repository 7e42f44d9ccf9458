// Shared argument checks, dtype dispatch and (rows, features) canonicalisation.
//
// Every check names the op it guards ("te_cpp.<op>") and prints the offending values, so a user
// sees which op rejected which tensor, never a crash or a silent wrong answer.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/SmallVector.h>

#include <sstream>
#include <string>

namespace te_cpp {

using at::Tensor;

// TORCH_CHECK with the op's name in front of the message.
#define TE_CHECK(cond, op, ...) TORCH_CHECK((cond), "te_cpp.", op, ": ", __VA_ARGS__)
// Same, raising ValueError (bad configuration rather than bad tensors).
#define TE_CHECK_VALUE(cond, op, ...) \
  TORCH_CHECK_VALUE((cond), "te_cpp.", op, ": ", __VA_ARGS__)

inline std::string shape_str(const Tensor& t) {
  std::ostringstream s;
  s << t.sym_sizes();
  return s.str();
}

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The input must be a floating tensor the kernels handle (fp32, fp64, bf16, fp16).
inline void check_float(const char* op, const char* name, const Tensor& t) {
  TE_CHECK(t.defined(), op, name, " is undefined");
  TE_CHECK(is_supported_float(t.scalar_type()), op, name,
           " must be float32, float64, bfloat16 or float16, got ", t.scalar_type());
}

// The output dtype argument of an op must be one the kernels write (fp32, fp64, bf16, fp16).
inline void check_float_dtype(const char* op, const char* name, at::ScalarType t) {
  TE_CHECK_VALUE(is_supported_float(t), op, name,
                 " must be float32, float64, bfloat16 or float16, got ", t);
}

// torch's name of a buffer dtype ("uint8", "float32"), as the checks below print it.
inline const char* torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kByte: return "uint8";
    case at::kFloat: return "float32";
    default: return c10::toString(t);
  }
}

// A raw buffer of the quantized-tensor ops (FP8 / FP4 bytes, E8M0 / E4M3 scale bytes, fp32
// scales and amaxes) must be defined and of `dtype`; `what` (optional) says what its elements
// are: "<name> must be uint8 (raw FP8 bytes), got Float".
inline void check_buffer(const char* op, const char* name, const Tensor& t, at::ScalarType dtype,
                         const char* what = nullptr) {
  TE_CHECK(t.defined() && t.scalar_type() == dtype, op, name, " must be ",
           torch_dtype_name(dtype), what ? " (" : "", what ? what : "", what ? ")" : "",
           ", got ", t.defined() ? c10::toString(t.scalar_type()) : "undefined");
}

// A per-tensor scale, scale_inv or amax: a float32 buffer of shape [1].
inline void check_scalar_buffer(const char* op, const char* name, const Tensor& t) {
  check_buffer(op, name, t, at::kFloat);
  TE_CHECK(t.dim() == 1 && t.sym_size(0) == 1, op, name, " must have shape [1], got ",
           shape_str(t));
}

inline void check_min_dim(const char* op, const char* name, const Tensor& t, int64_t dim) {
  TE_CHECK(t.dim() >= dim, op, name, " must have at least ", dim, " dimension(s), got shape ",
           shape_str(t));
}

inline void check_same_device(const char* op, const char* name_a, const Tensor& a,
                              const char* name_b, const Tensor& b) {
  TE_CHECK(a.device() == b.device(), op, name_a, " and ", name_b,
           " must be on the same device, got ", a.device(), " and ", b.device());
}

inline void check_same_shape(const char* op, const char* name_a, const Tensor& a,
                             const char* name_b, const Tensor& b) {
  TE_CHECK(a.sym_sizes() == b.sym_sizes(), op, name_a, " and ", name_b,
           " must have the same shape, got ", shape_str(a), " and ", shape_str(b));
}

inline void check_same_dtype(const char* op, const char* name_a, const Tensor& a,
                             const char* name_b, const Tensor& b) {
  TE_CHECK(a.scalar_type() == b.scalar_type(), op, name_a, " and ", name_b,
           " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

// An in-place op writes `out` while reading `in`, so, as PyTorch's in-place ops: `out` must not
// have elements sharing memory (an expanded / stride-0 view), and `in` must not partially overlap
// it (the result would depend on the order of the writes). Full aliasing (`in` is `out`,
// element for element) is allowed only for elementwise ops (allow_full). Meta tensors have no
// addresses: only the internal-overlap check (strides) applies to them.
inline void check_inplace_overlap(const char* op, const char* out_name, const Tensor& out,
                                  const char* in_name, const Tensor& in, bool allow_full) {
  TE_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, op, out_name,
           " is written in place but several of its elements share one memory location "
           "(shape ", shape_str(out), ", strides ", out.sym_strides(),
           "); clone() it first");
  if (out.is_meta() || in.is_meta() || !in.defined()) return;
  const at::MemOverlapStatus s = at::get_overlap_status(out, in);
  TE_CHECK(s != at::MemOverlapStatus::Partial, op, in_name, " (shape ", shape_str(in),
           ") partially overlaps ", out_name, " (shape ", shape_str(out),
           "), which is written in place; clone() it first");
  TE_CHECK(allow_full || s != at::MemOverlapStatus::Full, op, in_name, " is the same memory as ",
           out_name, ", which is written in place; clone() it first");
}

// Sizes as SymInts with the last dimension replaced (used by shape-changing ops).
inline c10::SymDimVector sizes_with_last(const Tensor& t, c10::SymInt last) {
  c10::SymDimVector out(t.sym_sizes().begin(), t.sym_sizes().end());
  out.back() = std::move(last);
  return out;
}

// Canonical 2-D view of a contiguous tensor: rows = product of leading dims, features = last.
struct RowsFeatures {
  int64_t rows;
  int64_t features;
};

inline RowsFeatures rows_features(const Tensor& t) {
  const int64_t features = t.dim() == 0 ? 1 : t.size(-1);
  const int64_t rows = features == 0 ? 0 : t.numel() / features;
  return {rows, features};
}

}  // namespace te_cpp

// Floating dispatch shared by every kernel: fp32, fp64, bf16, fp16.
#define TE_DISPATCH_FLOAT(TYPE, OP, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, OP, __VA_ARGS__)
