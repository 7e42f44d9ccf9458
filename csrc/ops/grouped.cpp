// Checks, allocation, Meta kernels and front end of the grouped family (GroupedLinear).
#include "ops/grouped.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <string>

#include "ops/fp8_block.h"
#include "ops/nvfp4.h"
#include "ops/quantize.h"
#include "ops/transpose.h"

namespace te_cpp {

namespace {

std::string indexed(const char* name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

// The tensors of a list argument share the reference's dtype and device, have `dim` dims, and
// (when `sizes` is given) those sizes.
void check_list(const char* op, const char* list_name, at::TensorList list, const char* ref_name,
                const Tensor& ref, int64_t dim) {
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = indexed(list_name, i);
    const Tensor& t = list[i];
    check_float(op, name.c_str(), t);
    check_same_device(op, name.c_str(), t, ref_name, ref);
    check_same_dtype(op, name.c_str(), t, ref_name, ref);
    TE_CHECK(t.dim() == dim, op, name, " must be ", dim, "-D, got shape ", shape_str(t));
    TE_CHECK(t.sym_sizes() == list[0].sym_sizes(), op, "all ", list_name,
             " must have the same shape, got ", shape_str(list[0]), " and ", shape_str(t),
             " (", name, ")");
  }
}

void check_2d(const char* op, const char* name, const Tensor& t, const char* dims) {
  TE_CHECK(t.dim() == 2, op, name, " must be 2-D ", dims,
           " (flatten the leading dims), got shape ", shape_str(t));
}

void check_count(const char* op, const char* list_name, size_t count, int64_t groups) {
  TE_CHECK(static_cast<int64_t>(count) == groups, op, "got ", count, " ", list_name,
           " for ", groups, " groups (split_sizes has ", groups, " entries)");
}

// bias_scales: [T], float32 or the data's dtype, on its device, and only with biases.
void check_scales(const char* op, const std::optional<Tensor>& scales, const Tensor& data,
                  const char* data_name, at::TensorList biases) {
  if (!scales.has_value()) return;
  TE_CHECK(!biases.empty(), op, "bias_scales given without biases");
  const Tensor& s = *scales;
  TE_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == data.scalar_type(), op,
           "bias_scales must be float32 or ", data_name, "'s dtype ", data.scalar_type(),
           ", got ", s.scalar_type());
  check_same_device(op, "bias_scales", s, data_name, data);
  TE_CHECK(s.dim() == 1 && s.sym_size(0) == data.sym_size(0), op, "bias_scales shape ",
           shape_str(s), " must be [tokens] for ", data_name, " shape ", shape_str(data));
}

void check_biases(const char* op, at::TensorList biases, int64_t groups, const Tensor& data,
                  const char* data_name, const c10::SymInt& features) {
  if (biases.empty()) return;
  check_count(op, "biases", biases.size(), groups);
  check_list(op, "biases", biases, data_name, data, 1);
  TE_CHECK(biases[0].sym_size(0) == features, op, "biases must have shape [out_features] = [",
           features, "], got ", shape_str(biases[0]));
}

}  // namespace

int64_t GroupedLinear::num_groups(const char* op, const Tensor& split_sizes) {
  TE_CHECK(split_sizes.defined(), op, "split_sizes is undefined");
  TE_CHECK(split_sizes.scalar_type() == at::kLong, op, "split_sizes must be int64, got ",
           split_sizes.scalar_type());
  TE_CHECK(split_sizes.dim() == 1, op, "split_sizes must be 1-D [num_groups], got shape ",
           shape_str(split_sizes));
  const int64_t groups = split_sizes.sym_size(0).guard_int(__FILE__, __LINE__);
  TE_CHECK(groups >= 1, op, "split_sizes must have at least one group, got shape ",
           shape_str(split_sizes));
  return groups;
}

std::vector<int64_t> GroupedLinear::row_offsets(const char* op, const Tensor& split_sizes,
                                                int64_t rows, const char* rows_name) {
  const Tensor s = split_sizes.to(at::kCPU).contiguous();  // a device tensor: one sync
  const int64_t* p = s.const_data_ptr<int64_t>();
  std::vector<int64_t> offsets(static_cast<size_t>(s.numel() + 1), 0);
  for (int64_t g = 0; g < s.numel(); ++g) {
    TE_CHECK(p[g] >= 0, op, "split_sizes[", g, "] is ", p[g], "; split sizes must be >= 0");
    offsets[g + 1] = offsets[g] + p[g];
  }
  TE_CHECK(offsets.back() == rows, op, "split_sizes sum to ", offsets.back(), " but ",
           rows_name, " has ", rows, " rows");
  return offsets;
}

void GroupedLinear::check_fwd(const char* op, const Tensor& x, const Tensor& split_sizes,
                              at::TensorList weights, at::TensorList biases,
                              const std::optional<Tensor>& bias_scales) {
  check_float(op, "input", x);
  check_2d(op, "input", x, "[tokens, in_features]");
  const int64_t groups = num_groups(op, split_sizes);
  check_count(op, "weights", weights.size(), groups);
  check_list(op, "weights", weights, "input", x, 2);
  TE_CHECK(x.sym_size(1) == weights[0].sym_size(1), op, "input's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weights (shape ",
           shape_str(weights[0]), ")");
  check_biases(op, biases, groups, x, "input", weights[0].sym_size(0));
  check_scales(op, bias_scales, x, "input", biases);
}

Tensor GroupedLinear::allocate_fwd(const Tensor& x, at::TensorList weights) {
  return at::empty_symint({x.sym_size(0), weights[0].sym_size(0)}, x.options());
}

void GroupedLinear::check_dgrad(const char* op, const Tensor& dy, const Tensor& split_sizes,
                                at::TensorList weights) {
  check_float(op, "grad_output", dy);
  check_2d(op, "grad_output", dy, "[tokens, out_features]");
  const int64_t groups = num_groups(op, split_sizes);
  check_count(op, "weights", weights.size(), groups);
  check_list(op, "weights", weights, "grad_output", dy, 2);
  TE_CHECK(dy.sym_size(1) == weights[0].sym_size(0), op, "grad_output's last dimension (shape ",
           shape_str(dy), ") must equal out_features of the weights (shape ",
           shape_str(weights[0]), ")");
}

Tensor GroupedLinear::allocate_dgrad(const Tensor& dy, at::TensorList weights) {
  return at::empty_symint({dy.sym_size(0), weights[0].sym_size(1)}, dy.options());
}

void GroupedLinear::check_wgrad(const char* op, const Tensor& dy, const Tensor& x,
                                const Tensor& split_sizes) {
  check_float(op, "grad_output", dy);
  check_float(op, "input", x);
  check_same_device(op, "grad_output", dy, "input", x);
  check_same_dtype(op, "grad_output", dy, "input", x);
  check_2d(op, "grad_output", dy, "[tokens, out_features]");
  check_2d(op, "input", x, "[tokens, in_features]");
  TE_CHECK(dy.sym_size(0) == x.sym_size(0), op, "grad_output (shape ", shape_str(dy),
           ") and input (shape ", shape_str(x), ") must have the same number of rows");
  num_groups(op, split_sizes);
}

std::vector<Tensor> GroupedLinear::allocate_wgrad(const Tensor& dy, const Tensor& x,
                                                  const Tensor& split_sizes) {
  const int64_t groups = split_sizes.sym_size(0).guard_int(__FILE__, __LINE__);
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    out.push_back(at::empty_symint({dy.sym_size(1), x.sym_size(1)}, dy.options()));
  }
  return out;
}

void GroupedLinear::check_bias_bwd(const char* op, const Tensor& dy, const Tensor& split_sizes,
                                   at::TensorList biases,
                                   const std::optional<Tensor>& bias_scales,
                                   at::ScalarType bias_dtype) {
  check_float(op, "grad_output", dy);
  check_2d(op, "grad_output", dy, "[tokens, out_features]");
  const int64_t groups = num_groups(op, split_sizes);
  check_biases(op, biases, groups, dy, "grad_output", dy.sym_size(1));
  check_scales(op, bias_scales, dy, "grad_output", biases);
  TE_CHECK(is_supported_float(bias_dtype), op,
           "bias dtype must be float32, float64, bfloat16 or float16, got ", bias_dtype);
}

std::tuple<std::vector<Tensor>, Tensor> GroupedLinear::allocate_bias_bwd(
    const Tensor& dy, const Tensor& split_sizes, const std::optional<Tensor>& bias_scales,
    at::ScalarType bias_dtype) {
  const int64_t groups = split_sizes.sym_size(0).guard_int(__FILE__, __LINE__);
  std::vector<Tensor> dbias;
  dbias.reserve(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    dbias.push_back(at::empty_symint({dy.sym_size(1)}, dy.options().dtype(bias_dtype)));
  }
  Tensor dscales = bias_scales.has_value()
                       ? at::empty_symint({dy.sym_size(0)}, bias_scales->options())
                       : at::empty({0}, dy.options());
  return {std::move(dbias), std::move(dscales)};
}

void GroupedQuantize::check_fp8(const char* op, const Tensor& x, const Tensor& split_sizes,
                                const std::optional<Tensor>& scales, at::ScalarType fp8_dtype,
                                c10::ArrayRef<double> amax_epsilons) {
  check_float(op, "input", x);
  check_2d(op, "input", x, "[tokens, features]");
  const int64_t groups = GroupedLinear::num_groups(op, split_sizes);
  check_fp8_dtype(op, fp8_dtype);
  TE_CHECK_VALUE(static_cast<int64_t>(amax_epsilons.size()) == groups, op, "got ",
                 amax_epsilons.size(), " amax_epsilons for ", groups, " groups");
  for (size_t g = 0; g < amax_epsilons.size(); ++g) {
    check_amax_epsilon(op, amax_epsilons[g], static_cast<int64_t>(g));
  }
  if (!scales.has_value()) return;
  check_buffer(op, "scales", *scales, at::kFloat);
  TE_CHECK(scales->dim() == 1 && scales->sym_size(0) == groups, op, "scales must have shape [",
           groups, "] (one per group), got ", shape_str(*scales));
  check_same_device(op, "input", x, "scales", *scales);
}

std::tuple<Tensor, Tensor, Tensor> GroupedQuantize::allocate_fp8(const Tensor& x,
                                                                 const Tensor& split_sizes) {
  const auto f32 = x.options().dtype(at::kFloat);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(at::kByte)),
          at::empty_symint({split_sizes.sym_size(0)}, f32),
          at::empty_symint({split_sizes.sym_size(0)}, f32)};
}

void GroupedQuantize::check_fp8_dequantize(const char* op, const Tensor& data,
                                           const Tensor& split_sizes, const Tensor& scale_inv,
                                           at::ScalarType fp8_dtype, at::ScalarType dtype) {
  check_buffer(op, "data", data, at::kByte, "raw FP8 bytes");
  check_2d(op, "data", data, "[tokens, features]");
  const int64_t groups = GroupedLinear::num_groups(op, split_sizes);
  check_buffer(op, "scale_inv", scale_inv, at::kFloat);
  TE_CHECK(scale_inv.dim() == 1 && scale_inv.sym_size(0) == groups, op,
           "scale_inv must have shape [", groups, "] (one per group), got ",
           shape_str(scale_inv));
  check_same_device(op, "data", data, "scale_inv", scale_inv);
  check_fp8_dtype(op, fp8_dtype);
  check_float_dtype(op, "dtype", dtype);
}

void GroupedQuantize::check_fp8_linear_fwd(const char* op, const Tensor& x,
                                           const Tensor& x_scale_inv, at::ScalarType x_fp8,
                                           const Tensor& split_sizes, at::TensorList weights,
                                           at::TensorList weight_scale_invs,
                                           at::ScalarType w_fp8, at::TensorList biases,
                                           const std::optional<Tensor>& bias_scales,
                                           at::ScalarType out_dtype) {
  check_fp8_dequantize(op, x, split_sizes, x_scale_inv, x_fp8, at::kFloat);
  const int64_t groups = split_sizes.sym_size(0).guard_int(__FILE__, __LINE__);
  check_count(op, "weights", weights.size(), groups);
  check_count(op, "weight_scale_invs", weight_scale_invs.size(), groups);
  check_fp8_dtype(op, w_fp8);
  for (size_t g = 0; g < weights.size(); ++g) {
    const std::string name = indexed("weights", g), sname = indexed("weight_scale_invs", g);
    const Tensor& w = weights[g];
    const Tensor& s = weight_scale_invs[g];
    check_buffer(op, name.c_str(), w, at::kByte, "raw FP8 bytes");
    TE_CHECK(w.dim() == 2 && w.sym_sizes() == weights[0].sym_sizes(), op, name,
             " must be 2-D [out_features, in_features] like weights[0] (shape ",
             shape_str(weights[0]), "), got shape ", shape_str(w));
    check_same_device(op, name.c_str(), w, "x", x);
    check_scalar_buffer(op, sname.c_str(), s);
    check_same_device(op, sname.c_str(), s, "x", x);
  }
  TE_CHECK(x.sym_size(1) == weights[0].sym_size(1), op, "x's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weights (shape ",
           shape_str(weights[0]), ")");
  if (!biases.empty()) {
    check_count(op, "biases", biases.size(), groups);
    for (size_t g = 0; g < biases.size(); ++g) {
      const std::string name = indexed("biases", g);
      check_float(op, name.c_str(), biases[g]);
      check_same_device(op, name.c_str(), biases[g], "x", x);
      TE_CHECK(biases[g].dim() == 1 && biases[g].sym_size(0) == weights[0].sym_size(0), op,
               name, " must have shape [out_features] = [", weights[0].sym_size(0), "], got ",
               shape_str(biases[g]));
    }
  }
  if (bias_scales.has_value()) {
    TE_CHECK(!biases.empty(), op, "bias_scales given without biases");
    check_float(op, "bias_scales", *bias_scales);
    check_same_device(op, "bias_scales", *bias_scales, "x", x);
    TE_CHECK(bias_scales->dim() == 1 && bias_scales->sym_size(0) == x.sym_size(0), op,
             "bias_scales shape ", shape_str(*bias_scales), " must be [tokens] for x shape ",
             shape_str(x));
  }
  check_float_dtype(op, "out_dtype", out_dtype);
}

void GroupedQuantize::check_mxfp8(const char* op, const Tensor& x, const Tensor& split_sizes,
                                  at::ScalarType fp8_dtype, bool rowwise, bool columnwise) {
  check_float(op, "input", x);
  check_2d(op, "input", x, "[tokens, features]");
  GroupedLinear::num_groups(op, split_sizes);
  check_fp8_dtype(op, fp8_dtype);
  TE_CHECK_VALUE(rowwise || columnwise, op, "neither rowwise nor columnwise usage is set");
  TE_CHECK(x.sym_size(1) % fp8::kMXFP8BlockSize == 0, op,
           "MXFP8 needs the last dimension to be a multiple of 32 (one E8M0 scale per 32 "
           "consecutive elements), got shape ", shape_str(x));
  TE_CHECK(!columnwise || x.sym_size(0) % fp8::kMXFP8BlockSize == 0, op,
           "MXFP8's columnwise copy needs the number of rows to be a multiple of 32, got shape ",
           shape_str(x));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> GroupedQuantize::allocate_mxfp8(const Tensor& x,
                                                                           bool rowwise,
                                                                           bool columnwise) {
  const auto u8 = x.options().dtype(at::kByte);
  const c10::SymInt& rows = x.sym_size(0);
  const c10::SymInt& cols = x.sym_size(1);
  const int64_t block = fp8::kMXFP8BlockSize;
  const auto none = [&] { return at::empty({0}, u8); };  // distinct: outputs never alias
  return {rowwise ? at::empty_symint({rows, cols}, u8) : none(),
          rowwise ? at::empty_symint({rows, cols / block}, u8) : none(),
          columnwise ? at::empty_symint({cols, rows}, u8) : none(),
          columnwise ? at::empty_symint({cols, rows / block}, u8) : none()};
}

void GroupedQuantize::check_fp8_block(const char* op, const Tensor& x, const Tensor& split_sizes,
                                      at::ScalarType fp8_dtype, int64_t block_dim,
                                      double amax_epsilon) {
  check_float(op, "input", x);
  check_2d(op, "input", x, "[tokens, features]");
  GroupedLinear::num_groups(op, split_sizes);
  check_fp8_dtype(op, fp8_dtype);
  check_fp8_block_dim(op, block_dim);
  check_amax_epsilon(op, amax_epsilon);
}

c10::SymDimVector GroupedQuantize::fp8_block_scale_sizes(const c10::SymInt& rows,
                                                         const c10::SymInt& cols, int64_t groups,
                                                         int64_t block_dim, bool columnwise) {
  const int64_t b = fp8::kFp8BlockSize;
  const c10::SymInt feature_blocks = (cols + (b - 1)) / b;
  // blocks along the rows axis: one per row (1x128 rowwise), else at most U = (T + 127 G) / 128
  // (sum over the groups of ceil(n_g / 128) <= (sum of n_g + 127) / 128)
  const c10::SymInt row_blocks = (rows + (b - 1) * groups) / b;
  if (!columnwise) {
    return {block_dim == 1 ? rows : row_blocks, feature_blocks};
  }
  return {block_dim == 1 ? cols : feature_blocks, row_blocks};
}

std::tuple<Tensor, Tensor> GroupedQuantize::allocate_fp8_block(const Tensor& x,
                                                               const Tensor& split_sizes,
                                                               int64_t block_dim,
                                                               bool columnwise) {
  const c10::SymInt& rows = x.sym_size(0);
  const c10::SymInt& cols = x.sym_size(1);
  const int64_t groups = split_sizes.sym_size(0).guard_int(__FILE__, __LINE__);
  Tensor data = columnwise ? at::empty_symint({cols, rows}, x.options().dtype(at::kByte))
                           : at::empty_symint({rows, cols}, x.options().dtype(at::kByte));
  Tensor scale = at::empty_symint(fp8_block_scale_sizes(rows, cols, groups, block_dim, columnwise),
                                  x.options().dtype(at::kFloat));
  return {data, scale};
}

void GroupedQuantize::check_fp8_block_dequantize(const char* op, const Tensor& data,
                                                 const Tensor& split_sizes,
                                                 const Tensor& scale_inv,
                                                 at::ScalarType fp8_dtype, int64_t block_dim,
                                                 bool columnwise, at::ScalarType dtype) {
  check_buffer(op, "data", data, at::kByte, "raw FP8 bytes");
  check_2d(op, "data", data, columnwise ? "[features, tokens]" : "[tokens, features]");
  const int64_t groups = GroupedLinear::num_groups(op, split_sizes);
  check_fp8_dtype(op, fp8_dtype);
  check_fp8_block_dim(op, block_dim);
  check_buffer(op, "scale_inv", scale_inv, at::kFloat);
  const c10::SymInt& rows = data.sym_size(columnwise ? 1 : 0);
  const c10::SymInt& cols = data.sym_size(columnwise ? 0 : 1);
  const auto expected = fp8_block_scale_sizes(rows, cols, groups, block_dim, columnwise);
  TE_CHECK(scale_inv.sym_sizes() == c10::SymIntArrayRef(expected), op, "scale_inv must have "
           "shape ", c10::SymIntArrayRef(expected), " for ", columnwise ? "columnwise " : "",
           "data of shape ", shape_str(data), ", ", groups, " groups and block_dim ", block_dim,
           ", got ", shape_str(scale_inv));
  check_same_device(op, "data", data, "scale_inv", scale_inv);
  check_float_dtype(op, "dtype", dtype);
}

void GroupedQuantize::check_nvfp4(const char* op, const Tensor& x, const Tensor& split_sizes,
                                  bool columnwise, const std::optional<Tensor>& sr_seeds) {
  check_float(op, "input", x);
  check_2d(op, "input", x, "[tokens, features]");
  const int64_t groups = GroupedLinear::num_groups(op, split_sizes);
  TE_CHECK(x.sym_size(1) % fp4::kBlock == 0, op,
           "input's last dimension must be a multiple of 16 (one E4M3 scale per 16 "
           "consecutive elements), got shape ", shape_str(x));
  TE_CHECK(!columnwise || x.sym_size(0) % fp4::kBlock == 0, op,
           "NVFP4's columnwise copy needs the number of rows to be a multiple of 16, got shape ",
           shape_str(x));
  if (!sr_seeds.has_value()) return;
  const Tensor& s = *sr_seeds;
  TE_CHECK(s.scalar_type() == at::kLong, op, "sr_seeds must be int64, got ", s.scalar_type());
  TE_CHECK(s.dim() == 1 && s.sym_size(0) == groups, op, "sr_seeds must have shape [", groups,
           "] (one seed per group), got ", shape_str(s));
  check_same_device(op, "input", x, "sr_seeds", s);
}

std::tuple<Tensor, Tensor, Tensor> GroupedQuantize::allocate_nvfp4(const Tensor& x,
                                                                   const Tensor& split_sizes,
                                                                   bool columnwise) {
  const auto u8 = x.options().dtype(at::kByte);
  const c10::SymInt& rows = x.sym_size(columnwise ? 1 : 0);
  const c10::SymInt& cols = x.sym_size(columnwise ? 0 : 1);
  return {at::empty_symint({rows, cols / 2}, u8),
          at::empty_symint({rows, cols / fp4::kBlock}, u8),
          at::empty_symint({split_sizes.sym_size(0)}, x.options().dtype(at::kFloat))};
}

void GroupedQuantize::check_nvfp4_dequantize(const char* op, const Tensor& data,
                                             const Tensor& split_sizes, const Tensor& scale,
                                             const Tensor& amax, at::ScalarType dtype) {
  check_buffer(op, "data", data, at::kByte, "two E2M1 codes per byte");
  check_2d(op, "data", data, "[rows, columns / 2]");
  const int64_t groups = GroupedLinear::num_groups(op, split_sizes);
  TE_CHECK(data.sym_size(1) % (fp4::kBlock / 2) == 0, op,
           "data's last dimension must be a multiple of 8 (16 packed elements per block), got "
           "shape ", shape_str(data));
  check_buffer(op, "scale_e4m3", scale, at::kByte, "E4M3 bytes");
  const c10::SymInt scale_cols = data.sym_size(1) / (fp4::kBlock / 2);
  TE_CHECK(scale.dim() == 2 && scale.sym_size(0) == data.sym_size(0) &&
               scale.sym_size(1) == scale_cols,
           op, "scale_e4m3 must have shape [", data.sym_size(0), ", ", scale_cols,
           "] for data of shape ", shape_str(data), ", got ", shape_str(scale));
  check_buffer(op, "amax", amax, at::kFloat);
  TE_CHECK(amax.dim() == 1 && amax.sym_size(0) == groups, op, "amax must have shape [", groups,
           "] (one per group), got ", shape_str(amax));
  check_same_device(op, "data", data, "scale_e4m3", scale);
  check_same_device(op, "data", data, "amax", amax);
  check_float_dtype(op, "dtype", dtype);
}

TE_DEFINE_STUB(grouped_gemm_stub, void(c10::ArrayRef<GemmArgs>));
TE_DEFINE_STUB(grouped_scaled_bias_stub, void(const GroupedScaledBiasArgs&));
TE_DEFINE_STUB(grouped_bias_bwd_stub, void(const GroupedBiasBwdArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

// Element `index` of a contiguous buffer t (index counted in t's elements).
const void* at_elem(const Tensor& t, int64_t index) {
  return static_cast<const char*>(t.const_data_ptr()) + index * t.element_size();
}
void* at_elem_mut(const Tensor& t, int64_t index) {
  return static_cast<char*>(t.mutable_data_ptr()) + index * t.element_size();
}

// A weight W [out, in] as a GEMM operand: row-major (rows ld apart), column-major (W^T
// row-major, columns ld apart), or else a contiguous copy.
struct Weight {
  Tensor keep;  // alive until the GEMMs have run
  const void* ptr;
  bool col_major;
  int64_t ld;
};

Weight weight_operand(const Tensor& w) {
  const int64_t r = w.size(0), c = w.size(1), sr = w.stride(0), sc = w.stride(1);
  if (sc == 1 && (sr >= c || r <= 1)) {
    return Weight{w, w.const_data_ptr(), false, std::max<int64_t>({sr, c, 1})};
  }
  if (sr == 1 && (sc >= r || c <= 1)) {
    return Weight{w, w.const_data_ptr(), true, std::max<int64_t>({sc, r, 1})};
  }
  const Tensor copy = w.contiguous();
  return Weight{copy, copy.const_data_ptr(), false, std::max<int64_t>(c, 1)};
}

GemmArgs plain_gemm(at::ScalarType dtype, int64_t m, int64_t n, int64_t k) {
  GemmArgs g{};
  g.dtype = dtype;
  g.m = m, g.n = n, g.k = k;
  g.ldc = n, g.ldd = n;
  g.alpha = 1.0, g.beta = 0.0;
  return g;
}

Tensor grouped_linear_fwd(const Tensor& x_in, const Tensor& split_sizes,
                          at::TensorList weights, at::TensorList biases,
                          const std::optional<Tensor>& bias_scales) {
  BelowAutograd below_autograd;
  const char* op = "grouped_linear_fwd";
  GroupedLinear::check_fwd(op, x_in, split_sizes, weights, biases, bias_scales);
  const auto guard = device_guard(x_in);
  Tensor y = GroupedLinear::allocate_fwd(x_in, weights);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, x_in.size(0), "input");
  if (y.numel() == 0) return y;
  const bool scaled = bias_scales.has_value();  // (checked: only with biases)
  // With scales in bf16 / fp16, s_t b_g is added to an fp32 GEMM output (the operands'
  // values exactly, fp32 accumulation as the reduced-precision GEMM) and y rounded once; the
  // GEMM's own rounding before the add would cost up to an ulp of x W^T where the two cancel.
  const at::ScalarType dtype = x_in.scalar_type();
  const bool widen = scaled && (dtype == at::kBFloat16 || dtype == at::kHalf);
  const Tensor x = widen ? x_in.to(at::kFloat).contiguous() : x_in.contiguous();
  Tensor out = widen ? at::empty(y.sizes(), y.options().dtype(at::kFloat)) : y;
  const int64_t groups = static_cast<int64_t>(weights.size());
  const int64_t n = y.size(1), k = x.size(1);
  std::vector<Tensor> keep;
  std::vector<const void*> bias_ptrs;
  for (const Tensor& b : biases) {
    keep.push_back(widen ? b.to(at::kFloat).contiguous() : b.contiguous());
    bias_ptrs.push_back(keep.back().const_data_ptr());
  }
  std::vector<GemmArgs> gemms;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = off[g + 1] - off[g];
    if (rows == 0) continue;
    const Weight w = weight_operand(widen ? weights[g].to(at::kFloat) : weights[g]);
    keep.push_back(w.keep);
    GemmArgs a = plain_gemm(x.scalar_type(), rows, n, k);
    a.a = at_elem(x, off[g] * k), a.trans_a = false, a.lda = std::max<int64_t>(k, 1);
    a.b = w.ptr, a.trans_b = !w.col_major, a.ldb = w.ld;  // op(B) = W^T
    a.d = at_elem_mut(out, off[g] * n);
    if (!biases.empty() && !scaled) {
      a.epilogue = GemmEpilogue::kBias;
      a.bias = bias_ptrs[g];
    }
    gemms.push_back(a);
  }
  const c10::DeviceType dev = x.device().type();
  grouped_gemm_stub(dev, c10::ArrayRef<GemmArgs>(gemms));
  if (scaled) {
    const Tensor s = widen ? bias_scales->to(at::kFloat).contiguous() : bias_scales->contiguous();
    grouped_scaled_bias_stub(dev, GroupedScaledBiasArgs{x.scalar_type(), s.scalar_type(), n, off,
                                                        bias_ptrs, s.const_data_ptr(),
                                                        out.mutable_data_ptr()});
    if (widen) y.copy_(out);
  }
  return y;
}

Tensor grouped_linear_dgrad(const Tensor& dy_in, const Tensor& split_sizes,
                            at::TensorList weights) {
  BelowAutograd below_autograd;
  const char* op = "grouped_linear_dgrad";
  GroupedLinear::check_dgrad(op, dy_in, split_sizes, weights);
  const auto guard = device_guard(dy_in);
  Tensor dx = GroupedLinear::allocate_dgrad(dy_in, weights);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, dy_in.size(0), "grad_output");
  if (dx.numel() == 0) return dx;
  const Tensor dy = dy_in.contiguous();
  const int64_t groups = static_cast<int64_t>(weights.size());
  const int64_t n = dx.size(1), k = dy.size(1);
  std::vector<Tensor> keep;
  std::vector<GemmArgs> gemms;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = off[g + 1] - off[g];
    if (rows == 0) continue;
    const Weight w = weight_operand(weights[g]);
    keep.push_back(w.keep);
    GemmArgs a = plain_gemm(dy.scalar_type(), rows, n, k);
    a.a = at_elem(dy, off[g] * k), a.trans_a = false, a.lda = std::max<int64_t>(k, 1);
    a.b = w.ptr, a.trans_b = w.col_major, a.ldb = w.ld;  // op(B) = W
    a.d = at_elem_mut(dx, off[g] * n);
    gemms.push_back(a);
  }
  grouped_gemm_stub(dy.device().type(), c10::ArrayRef<GemmArgs>(gemms));
  return dx;
}

std::vector<Tensor> grouped_linear_wgrad(const Tensor& dy_in, const Tensor& x_in,
                                         const Tensor& split_sizes) {
  BelowAutograd below_autograd;
  const char* op = "grouped_linear_wgrad";
  GroupedLinear::check_wgrad(op, dy_in, x_in, split_sizes);
  const auto guard = device_guard(dy_in);
  std::vector<Tensor> dw = GroupedLinear::allocate_wgrad(dy_in, x_in, split_sizes);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, dy_in.size(0), "grad_output");
  if (dw[0].numel() == 0) return dw;
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous();
  const int64_t m = dy.size(1), n = x.size(1);
  // every group, the empty ones too: a GEMM with k = 0 writes the zeros of their dW
  std::vector<GemmArgs> gemms;
  for (size_t g = 0; g < dw.size(); ++g) {
    const int64_t rows = off[g + 1] - off[g];
    GemmArgs a = plain_gemm(dy.scalar_type(), m, n, rows);
    a.a = at_elem(dy, off[g] * m), a.trans_a = true, a.lda = m;  // op(A) = dy_g^T
    a.b = at_elem(x, off[g] * n), a.trans_b = false, a.ldb = n;
    a.d = dw[g].mutable_data_ptr();
    gemms.push_back(a);
  }
  grouped_gemm_stub(dy.device().type(), c10::ArrayRef<GemmArgs>(gemms));
  return dw;
}

std::tuple<std::vector<Tensor>, Tensor> grouped_bias_bwd(const Tensor& dy_in,
                                                         const Tensor& split_sizes,
                                                         at::TensorList biases,
                                                         const std::optional<Tensor>& scales_in,
                                                         at::ScalarType bias_dtype) {
  BelowAutograd below_autograd;
  const char* op = "grouped_bias_bwd";
  GroupedLinear::check_bias_bwd(op, dy_in, split_sizes, biases, scales_in, bias_dtype);
  const auto guard = device_guard(dy_in);
  auto [dbias, dscales] =
      GroupedLinear::allocate_bias_bwd(dy_in, split_sizes, scales_in, bias_dtype);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, dy_in.size(0), "grad_output");
  const int64_t features = dy_in.size(1);
  if (features == 0) {
    if (scales_in.has_value()) dscales.zero_();  // dots over no features
    return {std::move(dbias), std::move(dscales)};
  }
  const Tensor dy = dy_in.contiguous();
  std::vector<Tensor> keep;
  std::vector<const void*> bias_ptrs;
  std::vector<void*> dbias_ptrs;
  for (const Tensor& d : dbias) dbias_ptrs.push_back(d.mutable_data_ptr());
  Tensor scales;
  if (scales_in.has_value()) {
    scales = scales_in->contiguous();
    for (const Tensor& b : biases) {
      keep.push_back(b.contiguous());
      bias_ptrs.push_back(keep.back().const_data_ptr());
    }
  }
  const bool scaled = scales.defined();
  grouped_bias_bwd_stub(
      dy.device().type(),
      GroupedBiasBwdArgs{dy.scalar_type(), bias_dtype,
                         scaled ? scales.scalar_type() : dy.scalar_type(), features, off,
                         dy.const_data_ptr(), scaled ? scales.const_data_ptr() : nullptr,
                         dbias_ptrs, bias_ptrs, scaled ? dscales.mutable_data_ptr() : nullptr});
  return {std::move(dbias), std::move(dscales)};
}

// The quantize kernels read float32, bfloat16 and float16; float64 is rounded to float32
// first (as the per-tensor ops do).
Tensor quantize_input(const Tensor& x) {
  return (x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x).contiguous();
}

std::tuple<Tensor, Tensor, Tensor> grouped_fp8_quantize(const Tensor& x_in,
                                                        const Tensor& split_sizes,
                                                        const std::optional<Tensor>& scales_in,
                                                        at::ScalarType fp8_dtype, bool pow2,
                                                        at::ArrayRef<double> amax_epsilons) {
  BelowAutograd below_autograd;
  const char* op = "grouped_fp8_quantize";
  GroupedQuantize::check_fp8(op, x_in, split_sizes, scales_in, fp8_dtype, amax_epsilons);
  const auto guard = device_guard(x_in);
  auto [data, scale_inv, amax] = GroupedQuantize::allocate_fp8(x_in, split_sizes);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, x_in.size(0), "input");
  const Tensor x = quantize_input(x_in);
  const Tensor scales = scales_in.has_value() ? scales_in->contiguous() : Tensor();
  const int64_t k = x.size(1);
  // every group, the empty ones too: their amax is 0 and their scale that amax's
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t g64 = static_cast<int64_t>(g);
    fp8_quantize_stub(
        x.device().type(),
        Fp8QuantizeArgs{x.scalar_type(), fp8_dtype, (off[g + 1] - off[g]) * k,
                        at_elem(x, off[g] * k),
                        scales.defined() ? scales.const_data_ptr<float>() + g64 : nullptr, pow2,
                        static_cast<float>(amax_epsilons[g]),
                        data.mutable_data_ptr<uint8_t>() + off[g] * k,
                        scale_inv.mutable_data_ptr<float>() + g64,
                        amax.mutable_data_ptr<float>() + g64});
  }
  return {data, scale_inv, amax};
}

Tensor grouped_fp8_dequantize(const Tensor& data_in, const Tensor& split_sizes,
                              const Tensor& scale_inv_in, at::ScalarType fp8_dtype,
                              at::ScalarType dtype) {
  BelowAutograd below_autograd;
  const char* op = "grouped_fp8_dequantize";
  GroupedQuantize::check_fp8_dequantize(op, data_in, split_sizes, scale_inv_in, fp8_dtype,
                                        dtype);
  const auto guard = device_guard(data_in);
  Tensor out = at::empty(data_in.sizes(), data_in.options().dtype(dtype));
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, data_in.size(0), "data");
  const Tensor data = data_in.contiguous(), scale_inv = scale_inv_in.contiguous();
  const int64_t k = data.size(1);
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t n = (off[g + 1] - off[g]) * k;
    if (n == 0) continue;
    fp8_dequantize_stub(data.device().type(),
                        Fp8DequantizeArgs{fp8_dtype, dtype, n,
                                          data.const_data_ptr<uint8_t>() + off[g] * k,
                                          scale_inv.const_data_ptr<float>() + g, nullptr,
                                          at_elem_mut(out, off[g] * k)});
  }
  return out;
}

Tensor grouped_fp8_linear_fwd(const Tensor& x, const Tensor& x_scale_inv, at::ScalarType x_fp8,
                              const Tensor& split_sizes, at::TensorList weights,
                              at::TensorList weight_scale_invs, at::ScalarType w_fp8,
                              at::TensorList biases, const std::optional<Tensor>& bias_scales,
                              at::ScalarType out_dtype) {
  BelowAutograd below_autograd;
  const char* op = "grouped_fp8_linear_fwd";
  GroupedQuantize::check_fp8_linear_fwd(op, x, x_scale_inv, x_fp8, split_sizes, weights,
                                        weight_scale_invs, w_fp8, biases, bias_scales,
                                        out_dtype);
  const auto guard = device_guard(x);
  const Tensor xf = grouped_fp8_dequantize(x, split_sizes, x_scale_inv, x_fp8, at::kFloat);
  std::vector<Tensor> wf, bf;
  for (size_t g = 0; g < weights.size(); ++g) {
    const Tensor w = weights[g].contiguous(), s = weight_scale_invs[g].contiguous();
    Tensor out = at::empty(w.sizes(), w.options().dtype(at::kFloat));
    if (out.numel() != 0) {
      fp8_dequantize_stub(w.device().type(),
                          Fp8DequantizeArgs{w_fp8, at::kFloat, w.numel(),
                                            w.const_data_ptr<uint8_t>(),
                                            s.const_data_ptr<float>(), nullptr,
                                            out.mutable_data_ptr()});
    }
    wf.push_back(out);
  }
  for (const Tensor& b : biases) bf.push_back(b.to(at::kFloat));
  std::optional<Tensor> sf;
  if (bias_scales.has_value()) sf = bias_scales->to(at::kFloat);
  const Tensor y = grouped_linear_fwd(xf, split_sizes, wf, bf, sf);
  return y.scalar_type() == out_dtype ? y : y.to(out_dtype);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> grouped_mxfp8_quantize(const Tensor& x_in,
                                                                  const Tensor& split_sizes,
                                                                  at::ScalarType fp8_dtype,
                                                                  bool rowwise, bool columnwise) {
  BelowAutograd below_autograd;
  const char* op = "grouped_mxfp8_quantize";
  GroupedQuantize::check_mxfp8(op, x_in, split_sizes, fp8_dtype, rowwise, columnwise);
  const auto guard = device_guard(x_in);
  auto [row_data, row_scale, col_data, col_scale] =
      GroupedQuantize::allocate_mxfp8(x_in, rowwise, columnwise);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, x_in.size(0), "input");
  if (columnwise) {
    for (size_t g = 0; g + 1 < off.size(); ++g) {
      const int64_t rows = off[g + 1] - off[g];
      TE_CHECK_VALUE(rows % fp8::kMXFP8BlockSize == 0, op, "split_sizes[", g, "] is ", rows,
                     "; MXFP8's columnwise copy (the operand of the weight-gradient GEMM) "
                     "quantizes blocks of 32 rows, so every split size must be a multiple "
                     "of 32 (pad each expert's tokens to a multiple of 32)");
    }
  }
  const int64_t block = fp8::kMXFP8BlockSize;
  // transposed_rows: the rows of the row-major src whose transpose is quantized (CPU), or 0
  const auto quantize = [&](const Tensor& src, Tensor& data, Tensor& scale,
                            int64_t transposed_rows) {
    if (src.numel() == 0) return;
    mxfp8_quantize_stub(src.device().type(),
                        Mxfp8QuantizeArgs{src.scalar_type(), fp8_dtype, src.numel() / block,
                                          src.const_data_ptr(), data.mutable_data_ptr<uint8_t>(),
                                          scale.mutable_data_ptr<uint8_t>(), transposed_rows});
  };
  const Tensor x = quantize_input(x_in);
  if (rowwise) quantize(x, row_data, row_scale, 0);
  if (columnwise) {  // the CPU kernel reads x^T in place
    if (x.is_cpu()) {
      quantize(x, col_data, col_scale, x.size(0));
    } else {
      quantize(transpose_2d(x), col_data, col_scale, 0);
    }
  }
  return {row_data, row_scale, col_data, col_scale};
}

// ---- Float8BlockScaling and NVFP4 per group: the per-tensor stubs on each group's rows (or
// each group's transpose, quantized into temporaries and copied into its columns) ----

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::tuple<Tensor, Tensor> grouped_fp8_block_quantize(const Tensor& x_in,
                                                      const Tensor& split_sizes,
                                                      at::ScalarType fp8_dtype,
                                                      int64_t block_dim, bool pow2,
                                                      double amax_epsilon, bool columnwise) {
  BelowAutograd below_autograd;
  const char* op = "grouped_fp8_block_quantize";
  GroupedQuantize::check_fp8_block(op, x_in, split_sizes, fp8_dtype, block_dim, amax_epsilon);
  const auto guard = device_guard(x_in);
  auto [data, scale] =
      GroupedQuantize::allocate_fp8_block(x_in, split_sizes, block_dim, columnwise);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, x_in.size(0), "input");
  scale.zero_();  // the blocks past the groups' (an upper bound is allocated) stay 0
  const Tensor x = quantize_input(x_in);
  const int64_t b = fp8::kFp8BlockSize;
  const auto quantize = [&](const Tensor& src, uint8_t* d, float* sc) {
    fp8_block_quantize_stub(
        src.device().type(),
        Fp8BlockQuantizeArgs{src.scalar_type(), fp8_dtype, src.size(0), src.size(1),
                             static_cast<int>(block_dim), pow2,
                             static_cast<float>(amax_epsilon),
                             fp8_block_value_for_inf(src.scalar_type()), src.const_data_ptr(),
                             d, sc});
  };
  int64_t first_block = 0;  // the group's first block along the rows axis
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n == 0 || x.size(1) == 0) continue;
    const Tensor rows = x.narrow(0, off[g], n);
    if (!columnwise) {  // the group's rows and scale rows are contiguous: written in place
      const int64_t scale_row = block_dim == 1 ? off[g] : first_block;
      quantize(rows, data.mutable_data_ptr<uint8_t>() + off[g] * x.size(1),
               scale.mutable_data_ptr<float>() + scale_row * scale.size(1));
    } else {
      const Tensor t = transpose_2d(rows);
      auto [d, sc] = Fp8BlockQuantize::allocate(t, block_dim);
      quantize(t, d.mutable_data_ptr<uint8_t>(), sc.mutable_data_ptr<float>());
      data.narrow(1, off[g], n).copy_(d);
      scale.narrow(1, first_block, sc.size(1)).copy_(sc);
    }
    first_block += ceil_div(n, b);
  }
  return {data, scale};
}

Tensor grouped_fp8_block_dequantize(const Tensor& data_in, const Tensor& split_sizes,
                                    const Tensor& scale_in, at::ScalarType fp8_dtype,
                                    int64_t block_dim, bool columnwise, at::ScalarType dtype) {
  BelowAutograd below_autograd;
  const char* op = "grouped_fp8_block_dequantize";
  GroupedQuantize::check_fp8_block_dequantize(op, data_in, split_sizes, scale_in, fp8_dtype,
                                              block_dim, columnwise, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = at::empty(data_in.sizes(), data_in.options().dtype(dtype));
  const int axis = columnwise ? 1 : 0;  // the tokens' axis
  const std::vector<int64_t> off = GroupedLinear::row_offsets(
      op, split_sizes, data_in.size(axis), columnwise ? "data's columns" : "data");
  const Tensor data = data_in.contiguous(), scale = scale_in.contiguous();
  const int64_t b = fp8::kFp8BlockSize;
  const auto dequantize = [&](const Tensor& d, const Tensor& sc, void* dst) {
    fp8_block_dequantize_stub(
        d.device().type(),
        Fp8BlockDequantizeArgs{fp8_dtype, dtype, d.size(0), d.size(1),
                               static_cast<int>(block_dim), d.const_data_ptr<uint8_t>(),
                               sc.const_data_ptr<float>(), dst});
  };
  int64_t first_block = 0;
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n == 0 || data.size(1 - axis) == 0) continue;
    const int64_t nb = ceil_div(n, b);
    if (!columnwise) {
      const int64_t scale_rows = block_dim == 1 ? n : nb;
      dequantize(data.narrow(0, off[g], n),
                 scale.narrow(0, block_dim == 1 ? off[g] : first_block, scale_rows),
                 at_elem_mut(out, off[g] * out.size(1)));
    } else {
      Tensor part = at::empty({data.size(0), n}, out.options());
      dequantize(data.narrow(1, off[g], n).contiguous(),
                 scale.narrow(1, first_block, nb).contiguous(), part.mutable_data_ptr());
      out.narrow(1, off[g], n).copy_(part);
    }
    first_block += nb;
  }
  return out;
}

std::tuple<Tensor, Tensor, Tensor> grouped_nvfp4_quantize(const Tensor& x_in,
                                                          const Tensor& split_sizes,
                                                          bool columnwise, bool rht,
                                                          bool block_2d,
                                                          const std::optional<Tensor>& seeds_in) {
  BelowAutograd below_autograd;
  const char* op = "grouped_nvfp4_quantize";
  GroupedQuantize::check_nvfp4(op, x_in, split_sizes, columnwise, seeds_in);
  const auto guard = device_guard(x_in);
  auto [data, scale, amax] = GroupedQuantize::allocate_nvfp4(x_in, split_sizes, columnwise);
  const std::vector<int64_t> off =
      GroupedLinear::row_offsets(op, split_sizes, x_in.size(0), "input");
  const int64_t block = fp4::kBlock;
  if (columnwise) {
    for (size_t g = 0; g + 1 < off.size(); ++g) {
      const int64_t rows = off[g + 1] - off[g];
      TE_CHECK_VALUE(rows % block == 0, op, "split_sizes[", g, "] is ", rows,
                     "; NVFP4's columnwise copy (the operand of the weight-gradient GEMM) "
                     "quantizes blocks of 16 rows, so every split size must be a multiple "
                     "of 16 (pad each expert's tokens to a multiple of 16)");
    }
  }
  amax.zero_();  // an empty group's amax is 0, as nvfp4_quantize's of an empty tensor
  const Tensor x = quantize_input(x_in);
  const Tensor seeds = seeds_in.has_value() ? seeds_in->contiguous() : Tensor();
  const auto quantize = [&](const Tensor& src, size_t g, uint8_t* d, uint8_t* sc) {
    nvfp4_quantize_stub(
        src.device().type(),
        Nvfp4QuantizeArgs{src.scalar_type(), src.size(0), src.size(1), src.const_data_ptr(), rht,
                          block_2d,
                          seeds.defined() ? seeds.const_data_ptr<int64_t>() + g : nullptr, d,
                          sc, amax.mutable_data_ptr<float>() + g});
  };
  const int64_t k = x.size(1);
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n == 0 || k == 0) continue;
    const Tensor rows = x.narrow(0, off[g], n);
    if (!columnwise) {
      quantize(rows, g, data.mutable_data_ptr<uint8_t>() + off[g] * (k / 2),
               scale.mutable_data_ptr<uint8_t>() + off[g] * (k / block));
    } else {
      const Tensor t = transpose_2d(rows);
      auto [d, sc, unused_amax] = Nvfp4Quantize::allocate(t);
      quantize(t, g, d.mutable_data_ptr<uint8_t>(), sc.mutable_data_ptr<uint8_t>());
      data.narrow(1, off[g] / 2, n / 2).copy_(d);
      scale.narrow(1, off[g] / block, n / block).copy_(sc);
    }
  }
  return {data, scale, amax};
}

Tensor grouped_nvfp4_dequantize(const Tensor& data_in, const Tensor& split_sizes,
                                const Tensor& scale_in, const Tensor& amax_in, bool columnwise,
                                bool rht, at::ScalarType dtype) {
  BelowAutograd below_autograd;
  const char* op = "grouped_nvfp4_dequantize";
  GroupedQuantize::check_nvfp4_dequantize(op, data_in, split_sizes, scale_in, amax_in, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = at::empty({data_in.size(0), data_in.size(1) * 2}, data_in.options().dtype(dtype));
  const int axis = columnwise ? 1 : 0;
  const std::vector<int64_t> off = GroupedLinear::row_offsets(
      op, split_sizes, out.size(axis), columnwise ? "data's (unpacked) columns" : "data");
  const Tensor data = data_in.contiguous(), scale = scale_in.contiguous();
  const Tensor amax = amax_in.contiguous();
  const int64_t block = fp4::kBlock;
  const auto dequantize = [&](const Tensor& d, const Tensor& sc, size_t g, void* dst) {
    nvfp4_dequantize_stub(d.device().type(),
                          Nvfp4DequantizeArgs{dtype, d.size(0), d.size(1) * 2,
                                              d.const_data_ptr<uint8_t>(),
                                              sc.const_data_ptr<uint8_t>(),
                                              amax.const_data_ptr<float>() + g, rht, dst});
  };
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n == 0 || out.size(1 - axis) == 0) continue;
    if (!columnwise) {
      dequantize(data.narrow(0, off[g], n), scale.narrow(0, off[g], n), g,
                 at_elem_mut(out, off[g] * out.size(1)));
    } else {
      TE_CHECK_VALUE(n % block == 0, op, "split_sizes[", g, "] is ", n,
                     "; a columnwise NVFP4 copy holds groups of a multiple of 16 rows");
      Tensor part = at::empty({data.size(0), n}, out.options());
      dequantize(data.narrow(1, off[g] / 2, n / 2).contiguous(),
                 scale.narrow(1, off[g] / block, n / block).contiguous(), g,
                 part.mutable_data_ptr());
      out.narrow(1, off[g], n).copy_(part);
    }
  }
  return out;
}

void register_front_ends(torch::Library& m) {
  m.impl("grouped_fp8_block_quantize", grouped_fp8_block_quantize);
  m.impl("grouped_fp8_block_dequantize", grouped_fp8_block_dequantize);
  m.impl("grouped_nvfp4_quantize", grouped_nvfp4_quantize);
  m.impl("grouped_nvfp4_dequantize", grouped_nvfp4_dequantize);
  m.impl("grouped_fp8_quantize", grouped_fp8_quantize);
  m.impl("grouped_fp8_dequantize", grouped_fp8_dequantize);
  m.impl("grouped_fp8_linear_fwd", grouped_fp8_linear_fwd);
  m.impl("grouped_mxfp8_quantize", grouped_mxfp8_quantize);
  m.impl("grouped_linear_fwd", grouped_linear_fwd);
  m.impl("grouped_linear_dgrad", grouped_linear_dgrad);
  m.impl("grouped_linear_wgrad", grouped_linear_wgrad);
  m.impl("grouped_bias_bwd", grouped_bias_bwd);
}

// ---- Meta kernels: checks and shapes only (the split values are never read) ----

Tensor grouped_linear_fwd_meta(const Tensor& x, const Tensor& split_sizes,
                               at::TensorList weights, at::TensorList biases,
                               const std::optional<Tensor>& bias_scales) {
  GroupedLinear::check_fwd("grouped_linear_fwd", x, split_sizes, weights, biases, bias_scales);
  return GroupedLinear::allocate_fwd(x, weights);
}

Tensor grouped_linear_dgrad_meta(const Tensor& dy, const Tensor& split_sizes,
                                 at::TensorList weights) {
  GroupedLinear::check_dgrad("grouped_linear_dgrad", dy, split_sizes, weights);
  return GroupedLinear::allocate_dgrad(dy, weights);
}

std::vector<Tensor> grouped_linear_wgrad_meta(const Tensor& dy, const Tensor& x,
                                              const Tensor& split_sizes) {
  GroupedLinear::check_wgrad("grouped_linear_wgrad", dy, x, split_sizes);
  return GroupedLinear::allocate_wgrad(dy, x, split_sizes);
}

std::tuple<std::vector<Tensor>, Tensor> grouped_bias_bwd_meta(
    const Tensor& dy, const Tensor& split_sizes, at::TensorList biases,
    const std::optional<Tensor>& bias_scales, at::ScalarType bias_dtype) {
  GroupedLinear::check_bias_bwd("grouped_bias_bwd", dy, split_sizes, biases, bias_scales,
                                bias_dtype);
  return GroupedLinear::allocate_bias_bwd(dy, split_sizes, bias_scales, bias_dtype);
}

std::tuple<Tensor, Tensor, Tensor> grouped_fp8_quantize_meta(
    const Tensor& x, const Tensor& split_sizes, const std::optional<Tensor>& scales,
    at::ScalarType fp8_dtype, bool, at::ArrayRef<double> amax_epsilons) {
  GroupedQuantize::check_fp8("grouped_fp8_quantize", x, split_sizes, scales, fp8_dtype,
                             amax_epsilons);
  return GroupedQuantize::allocate_fp8(x, split_sizes);
}

Tensor grouped_fp8_dequantize_meta(const Tensor& data, const Tensor& split_sizes,
                                   const Tensor& scale_inv, at::ScalarType fp8_dtype,
                                   at::ScalarType dtype) {
  GroupedQuantize::check_fp8_dequantize("grouped_fp8_dequantize", data, split_sizes, scale_inv,
                                        fp8_dtype, dtype);
  return at::empty_symint(data.sym_sizes(), data.options().dtype(dtype));
}

Tensor grouped_fp8_linear_fwd_meta(const Tensor& x, const Tensor& x_scale_inv,
                                   at::ScalarType x_fp8, const Tensor& split_sizes,
                                   at::TensorList weights, at::TensorList weight_scale_invs,
                                   at::ScalarType w_fp8, at::TensorList biases,
                                   const std::optional<Tensor>& bias_scales,
                                   at::ScalarType out_dtype) {
  GroupedQuantize::check_fp8_linear_fwd("grouped_fp8_linear_fwd", x, x_scale_inv, x_fp8,
                                        split_sizes, weights, weight_scale_invs, w_fp8, biases,
                                        bias_scales, out_dtype);
  return at::empty_symint({x.sym_size(0), weights[0].sym_size(0)},
                          x.options().dtype(out_dtype));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> grouped_mxfp8_quantize_meta(
    const Tensor& x, const Tensor& split_sizes, at::ScalarType fp8_dtype, bool rowwise,
    bool columnwise) {
  GroupedQuantize::check_mxfp8("grouped_mxfp8_quantize", x, split_sizes, fp8_dtype, rowwise,
                               columnwise);
  return GroupedQuantize::allocate_mxfp8(x, rowwise, columnwise);
}

std::tuple<Tensor, Tensor> grouped_fp8_block_quantize_meta(const Tensor& x,
                                                           const Tensor& split_sizes,
                                                           at::ScalarType fp8_dtype,
                                                           int64_t block_dim, bool,
                                                           double amax_epsilon,
                                                           bool columnwise) {
  GroupedQuantize::check_fp8_block("grouped_fp8_block_quantize", x, split_sizes, fp8_dtype,
                                   block_dim, amax_epsilon);
  return GroupedQuantize::allocate_fp8_block(x, split_sizes, block_dim, columnwise);
}

Tensor grouped_fp8_block_dequantize_meta(const Tensor& data, const Tensor& split_sizes,
                                         const Tensor& scale_inv, at::ScalarType fp8_dtype,
                                         int64_t block_dim, bool columnwise,
                                         at::ScalarType dtype) {
  GroupedQuantize::check_fp8_block_dequantize("grouped_fp8_block_dequantize", data, split_sizes,
                                              scale_inv, fp8_dtype, block_dim, columnwise,
                                              dtype);
  return at::empty_symint(data.sym_sizes(), data.options().dtype(dtype));
}

std::tuple<Tensor, Tensor, Tensor> grouped_nvfp4_quantize_meta(
    const Tensor& x, const Tensor& split_sizes, bool columnwise, bool, bool,
    const std::optional<Tensor>& sr_seeds) {
  GroupedQuantize::check_nvfp4("grouped_nvfp4_quantize", x, split_sizes, columnwise, sr_seeds);
  return GroupedQuantize::allocate_nvfp4(x, split_sizes, columnwise);
}

Tensor grouped_nvfp4_dequantize_meta(const Tensor& data, const Tensor& split_sizes,
                                     const Tensor& scale, const Tensor& amax, bool, bool,
                                     at::ScalarType dtype) {
  GroupedQuantize::check_nvfp4_dequantize("grouped_nvfp4_dequantize", data, split_sizes, scale,
                                          amax, dtype);
  return at::empty_symint({data.sym_size(0), data.sym_size(1) * 2}, data.options().dtype(dtype));
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("grouped_fp8_block_quantize", grouped_fp8_block_quantize_meta);
  m.impl("grouped_fp8_block_dequantize", grouped_fp8_block_dequantize_meta);
  m.impl("grouped_nvfp4_quantize", grouped_nvfp4_quantize_meta);
  m.impl("grouped_nvfp4_dequantize", grouped_nvfp4_dequantize_meta);
  m.impl("grouped_fp8_quantize", grouped_fp8_quantize_meta);
  m.impl("grouped_fp8_dequantize", grouped_fp8_dequantize_meta);
  m.impl("grouped_fp8_linear_fwd", grouped_fp8_linear_fwd_meta);
  m.impl("grouped_mxfp8_quantize", grouped_mxfp8_quantize_meta);
  m.impl("grouped_linear_fwd", grouped_linear_fwd_meta);
  m.impl("grouped_linear_dgrad", grouped_linear_dgrad_meta);
  m.impl("grouped_linear_wgrad", grouped_linear_wgrad_meta);
  m.impl("grouped_bias_bwd", grouped_bias_bwd_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
