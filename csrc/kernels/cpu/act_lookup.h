// Lookup tables of the exp-based activations for bf16 / fp16 inputs. A 16-bit float has 65536
// values, so act.f(x), and f'(x) where the gradient is g * f'(x), can be computed once for
// every one of them, by the same vector code as the kernels, and then read with a gather
// instead of an exp and a reciprocal per element. The tables hold the fp32 results before any
// rounding, so a kernel that reads them computes exactly what it would compute itself, bit for
// bit (tests/test_activation_lookup.py checks every input value of every tabulated op).
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/activation_math.h"
#include "kernels/cpu/lookup_count.h"
#include "kernels/cpu/vec.h"
#include "ops/activation.h"

namespace te_cpp::cpu {

template <typename T>
constexpr bool is_half_float = std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;

// What a table holds, for every value x of T:
//   kValue:   act.f(x);
//   kSlope:   f'(x), act.grad's result for g = 1, where the gradient is g * f'(x);
//   kSigmoid: act.sigmoid_part(x), the one transcendental of a sigmoid-based act functor, from
//             which act.grad_from_sigmoid makes the value and the gradient.
enum class Table { kValue, kSlope, kSigmoid };

// Activations whose (act half's) value is tabulated: those that spend an exp per element.
// The cheap ones (ReLU and its squares) stay computed: a gather costs them more. SiTUGLU's act
// half (a tanh and a sigmoid) is not tabulated yet.
constexpr bool has_value_table(Act k) {
  switch (k) {
    case Act::GELU: case Act::SILU: case Act::QGELU:
    case Act::GEGLU: case Act::QGEGLU: case Act::SWIGLU: case Act::GLU: case Act::CLAMPED_SWIGLU:
      return true;
    default:
      return false;
  }
}

// The table the backward of K reads, if any: the slope where the act half's gradient is
// g * f'(x), one product with a function of x alone (common/activation_math.h: Gelu::grad);
// the sigmoid where g enters earlier (autograd's order: SiLU, QGELU, sigmoid), so that only the
// sigmoid can be read and the rest is computed as the functor computes it.
constexpr std::optional<Table> grad_table(Act k) {
  switch (k) {
    case Act::GELU: case Act::GEGLU:
      return Table::kSlope;
    case Act::SILU: case Act::QGELU: case Act::SWIGLU: case Act::QGEGLU: case Act::GLU:
    case Act::CLAMPED_SWIGLU:
      return Table::kSigmoid;
    default:
      return std::nullopt;
  }
}

// Calls with fewer elements compute: building a table takes about as long as such a call, and
// a small call would read more table than data.
constexpr int64_t kLookupMinElems = int64_t{1} << 16;

// The most tables kept per (activation, dtype, kind): one per distinct ActConfig parameters;
// past it the kernels compute.
constexpr size_t kMaxLookupTables = 16;

inline std::atomic<int64_t> lookup_tables_built{0};

// The table of kind kKind of the act functor ActF for every 16-bit pattern of T, built on first
// use and kept for the process. Tables belong to the act functor (GELU's serve GEGLU too) and
// its configuration's parameters.
template <typename ActF, typename T, Table kKind>
const float* lookup_table(const ActConfig& cfg) {
  static_assert(is_half_float<T>);
  using Vec = AccVec<T>;
  constexpr int64_t kEntries = int64_t{1} << 16;
  static std::mutex mutex;
  static std::vector<std::pair<std::array<double, 3>, std::unique_ptr<float[]>>> tables;
  const std::array<double, 3> key{cfg.p0, cfg.p1, cfg.p2};
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [k, table] : tables) {
    if (std::memcmp(k.data(), key.data(), sizeof(key)) == 0) return table.get();
  }
  if (tables.size() >= kMaxLookupTables) return nullptr;
  auto table = std::make_unique<float[]>(kEntries);
  const ActF act(cfg);
  std::vector<uint16_t> bits(Vec::size());
  for (int64_t i = 0; i < kEntries; i += Vec::size()) {
    for (int64_t j = 0; j < Vec::size(); ++j) bits[j] = static_cast<uint16_t>(i + j);
    const Vec x = load_acc<T>(reinterpret_cast<const T*>(bits.data()));
    if constexpr (kKind == Table::kValue) {
      act.f(x).store(table.get() + i);
    } else if constexpr (kKind == Table::kSlope) {
      Vec f, slope;
      act.grad(x, Vec(1.f), f, slope);
      slope.store(table.get() + i);
    } else {
      act.sigmoid_part(x).store(table.get() + i);
    }
  }
  tables.emplace_back(key, std::move(table));
  lookup_tables_built.fetch_add(1, std::memory_order_relaxed);
  return tables.back().second.get();
}

// Whether T inputs of K have the table of kind kKind.
template <Act K, typename T, Table kKind>
constexpr bool kTabulated =
    is_half_float<T> && (kKind == Table::kValue ? has_value_table(K) : grad_table(K) == kKind);

// The call's table, or nullptr where it computes instead (a small call, or too many
// configurations).
template <Act K, typename T, Table kKind>
const float* lookup_for(const ActConfig& cfg, int64_t elems) {
  static_assert(kTabulated<K, T, kKind>);
  using ActF = typename ActTraits<K, float>::Act;
  return elems >= kLookupMinElems ? lookup_table<ActF, T, kKind>(cfg) : nullptr;
}

#if defined(CPU_CAPABILITY_AVX512)
// v rounded to T (round to nearest even, as store_acc<T> stores it), as the 16-bit patterns in
// a half-width vector.
template <typename T>
C10_ALWAYS_INLINE __m256i half_bits(const __m512& v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
#if defined(__AVX512BF16__)
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
    return at::vec::cvtfp32_bf16(v);
#endif
  } else {
    return at::vec::cvtfp32_fp16(v);
  }
}

// The fp32 values of 16 T patterns (exact).
template <typename T>
C10_ALWAYS_INLINE __m512 widen_bits(const __m256i& h) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// table[idx] for 16 indices, into a zeroed register (see lookup). The empty asm hides that the
// mask is full, so that the compiler keeps the zero source.
C10_ALWAYS_INLINE __m512 gather16(const float* table, __m512i idx) {
  __mmask16 all = 0xFFFF;
  asm("" : "+Yk"(all));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), all, idx, table, 4);
}
#elif defined(CPU_CAPABILITY_AVX2)
C10_ALWAYS_INLINE __m256 gather8(const float* table, __m256i idx) {
  __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  asm("" : "+x"(all));
  return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), table, idx, all, 4);
}
#endif

// table[x] for the first k elements of p (entry 0 past them): one gather (AVX-512, AVX2) or a
// loop. The gathers merge into a zeroed register: a gather keeps its destination's lanes
// where the mask is off, so with an undefined source the compiler may hand it a register
// the previous iteration wrote, chaining each gather to the one before.
template <typename T>
C10_ALWAYS_INLINE AccVec<T> lookup(const float* table, const T* p, int64_t k) {
  static_assert(is_half_float<T>);
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i h = k == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                            : _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << k) - 1), p);
  return gather16(table, _mm512_cvtepu16_epi32(h));
#elif defined(CPU_CAPABILITY_AVX2)
  alignas(16) uint16_t bits[8] = {};
  if (k < 8) std::memcpy(bits, p, static_cast<size_t>(k) * sizeof(T));
  const __m128i h = k == 8 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                           : _mm_load_si128(reinterpret_cast<const __m128i*>(bits));
  return gather8(table, _mm256_cvtepu16_epi32(h));
#else
  alignas(64) float out[AccVec<T>::size()] = {};
  for (int64_t j = 0; j < k; ++j) out[j] = table[p[j].x];
  return AccVec<T>::loadu(out);
#endif
}

// table[zr] for zr = z rounded to T (as store_acc<T> rounds), zr also returned.
template <typename T>
C10_ALWAYS_INLINE AccVec<T> lookup_rounded(const float* table, const AccVec<T>& z,
                                           AccVec<T>& zr) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i h = half_bits<T>(z);
  zr = widen_bits<T>(h);
  return gather16(table, _mm512_cvtepu16_epi32(h));
#else
  alignas(64) T bits[AccVec<T>::size()];
  store_acc<T>(bits, z);
  zr = load_acc<T>(bits);
  return lookup(table, bits, AccVec<T>::size());
#endif
}

template <typename T>
C10_ALWAYS_INLINE AccVec<T> lookup_rounded(const float* table, const AccVec<T>& z) {
  AccVec<T> zr;
  return lookup_rounded<T>(table, z, zr);
}

// Whether the backward of K reads a table for T inputs, and the call's table.
template <Act K, typename T>
constexpr bool kGradTabulated = is_half_float<T> && grad_table(K).has_value();

template <Act K, typename T>
const float* grad_lookup_for(const ActConfig& cfg, int64_t elems) {
  return lookup_for<K, T, *grad_table(K)>(cfg, elems);
}

// act.grad(x, g, f, gx) given the entry of x in K's grad table: gx = g * slope (f not set), or
// act.grad_from_sigmoid (f set).
template <Act K, typename ActF, typename Vec>
C10_ALWAYS_INLINE void grad_from_entry(const ActF& act, const Vec& x, const Vec& g,
                                       const Vec& entry, Vec& f, Vec& gx) {
  if constexpr (*grad_table(K) == Table::kSlope) {
    gx = g * entry;
  } else {
    act.grad_from_sigmoid(x, g, entry, f, gx);
  }
}

}  // namespace te_cpp::cpu
