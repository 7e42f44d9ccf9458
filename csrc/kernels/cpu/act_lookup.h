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
//             which act.grad_from_sigmoid makes the value and the gradient;
//   kTanh:    act.tanh_part(x), SiTU's other transcendental (its grad_from_parts takes both).
enum class Table { kValue, kSlope, kSigmoid, kTanh };

// Activations whose (act half's) value is tabulated: those that spend an exp per element.
// The cheap ones (ReLU and its squares) stay computed: a gather costs them more.
constexpr bool has_value_table(Act k) {
  switch (k) {
    case Act::GELU: case Act::SILU: case Act::QGELU:
    case Act::GEGLU: case Act::QGEGLU: case Act::SWIGLU: case Act::GLU: case Act::CLAMPED_SWIGLU:
    case Act::SITUGLU:
      return true;
    default:
      return false;
  }
}

// The table the backward of K reads, if any: the slope where the act half's gradient is
// g * f'(x), one product with a function of x alone (common/activation_math.h: Gelu::grad);
// the sigmoid where g enters earlier (autograd's order: SiLU, QGELU, sigmoid), so that only the
// sigmoid can be read and the rest is computed as the functor computes it. SiTUGLU's backward
// reads its tanh part as well (has_tanh_table).
constexpr std::optional<Table> grad_table(Act k) {
  switch (k) {
    case Act::GELU: case Act::GEGLU:
      return Table::kSlope;
    case Act::SILU: case Act::QGELU: case Act::SWIGLU: case Act::QGEGLU: case Act::GLU:
    case Act::CLAMPED_SWIGLU: case Act::SITUGLU:
      return Table::kSigmoid;
    default:
      return std::nullopt;
  }
}

constexpr bool has_tanh_table(Act k) { return k == Act::SITUGLU; }

// Calls with fewer elements compute: building a table takes about as long as such a call, and
// a small call would read more table than data.
constexpr int64_t kLookupMinElems = int64_t{1} << 16;

// The most tables kept per (activation, dtype, kind): one per distinct ActConfig parameters;
// past it the kernels compute.
constexpr size_t kMaxLookupTables = 16;

inline std::atomic<int64_t> lookup_tables_built{0};

// The flag (lookup_count.h) of T's forwards or backwards.
template <typename T>
constexpr int lookup_flag(bool forward) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return forward ? kLookupFp16Forward : kLookupFp16Backward;
  } else {
    return forward ? kLookupBf16Forward : kLookupBf16Backward;
  }
}

// The CPU's choice: AMD CPUs running the AVX512 kernels, whose 16-lane gather costs more than
// the exp and reciprocal it replaces, read only bf16's backward tables (fp16 inputs spread over
// more entries than L1 holds); other CPUs, and AMD CPUs with the AVX2 kernels (8-lane
// gathers), read every table (measured on Zen 4 and on an AMD EPYC without AVX-512:
// docs/architecture.md).
inline int cpu_lookup_use() {
  static const int use = [] {
#if (defined(__x86_64__) || defined(__i386__)) && defined(CPU_CAPABILITY_AVX512)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) return kLookupBf16Backward;
#endif
    return kLookupAll;
  }();
  return use;
}

// The flags in force: the CPU's choice while this is negative; set_activation_lookup_use
// (lookup_count.h) changes it for the process, to measure or test one path against the other.
inline std::atomic<int> lookup_use{-1};

inline int lookup_use_now() {
  const int use = lookup_use.load(std::memory_order_relaxed);
  return use < 0 ? cpu_lookup_use() : use;
}

// Whether a call of T evaluating the act half `elems` times reads tables in its direction.
template <typename T>
bool reads_tables(int64_t elems, bool forward) {
  return elems >= kLookupMinElems && (lookup_use_now() & lookup_flag<T>(forward)) != 0;
}

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
    } else if constexpr (kKind == Table::kSigmoid) {
      act.sigmoid_part(x).store(table.get() + i);
    } else {
      act.tanh_part(x).store(table.get() + i);
    }
  }
  tables.emplace_back(key, std::move(table));
  lookup_tables_built.fetch_add(1, std::memory_order_relaxed);
  return tables.back().second.get();
}

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
  return gather16(table, _mm512_cvtepu16_epi32(load_bits(p, k)));
#elif defined(CPU_CAPABILITY_AVX2)
  return gather8(table, _mm256_cvtepu16_epi32(load_bits(p, k)));
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
  const HalfBits h = half_bits<T>(z);
  zr = widen_bits<T>(h);
  return gather16(table, _mm512_cvtepu16_epi32(h));
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {  // the rounded upper halves, in place
    const __m256i r = bf16_rounded_lanes(z);
    zr = _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(0xFFFF0000)));
    return gather8(table, _mm256_srli_epi32(r, 16));
  }
  const HalfBits h = half_bits<T>(z);
  zr = widen_bits<T>(h);
  return gather8(table, _mm256_cvtepu16_epi32(h));
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

// What a kernel evaluates of K's act half: its value (the forwards), its gradient (the
// backwards), or the gradient and the value (the backwards that use the value too: the gated
// ones, for the linear half's gradient, and the scaled ones, for dscales).
enum class ActUse { kValue, kGrad, kGradValue };

// K's act half computed by its functor, on the k values of T at p (the rest of a vector: zeros)
// or on a vector z rounded to T first.
template <Act K, typename T>
struct ComputedAct {
  using Vec = AccVec<T>;
  typename ActTraits<K, acc_t<T>>::Act act;

  explicit ComputedAct(const ActConfig& cfg) : act(cfg) {}
  C10_ALWAYS_INLINE Vec f(const T* p, int64_t k) const { return act.f(load_acc<T>(p, k)); }
  // ReLU commutes with the rounding (max(round(z), 0) = round(max(z, 0))): the store's is enough
  C10_ALWAYS_INLINE Vec f_rounded(const Vec& z) const {
    return act.f(K == Act::RELU ? z : round_to<T>(z));
  }
  C10_ALWAYS_INLINE void grad(const T* p, int64_t k, const Vec& g, Vec& f, Vec& gx) const {
    act.grad(load_acc<T>(p, k), g, f, gx);
  }
  C10_ALWAYS_INLINE void grad_rounded(const Vec& z, const Vec& g, Vec& f, Vec& gx) const {
    act.grad(round_to<T>(z), g, f, gx);
  }
};

// The same read from this call's tables (ComputedAct's results bit for bit): the value from the
// value table; the gradient as g * slope, or the functor's grad_from_sigmoid of the tabulated
// sigmoid (SiTU: grad_from_parts of its tabulated tanh and sigmoid), which also gives f. With
// the slope, f comes from the value table under ActUse::kGradValue and is left unset otherwise.
template <Act K, typename T, ActUse kUse>
struct TabulatedAct {
  using Vec = AccVec<T>;
  typename ActTraits<K, float>::Act act;
  const float* value_tab;  // act.f (the forwards; the slope's f under kGradValue)
  const float* grad_tab;   // the table grad_table(K) names (the backwards)
  const float* tanh_tab;   // SiTU's tanh part (its backwards)

  C10_ALWAYS_INLINE Vec f(const T* p, int64_t k) const { return lookup(value_tab, p, k); }
  C10_ALWAYS_INLINE Vec f_rounded(const Vec& z) const { return lookup_rounded<T>(value_tab, z); }
  C10_ALWAYS_INLINE void grad(const T* p, int64_t k, const Vec& g, Vec& f, Vec& gx) const {
    if constexpr (*grad_table(K) == Table::kSlope) {
      gx = g * lookup(grad_tab, p, k);
      if constexpr (kUse == ActUse::kGradValue) f = lookup(value_tab, p, k);
    } else if constexpr (has_tanh_table(K)) {
      act.grad_from_parts(load_acc<T>(p, k), g, lookup(tanh_tab, p, k), lookup(grad_tab, p, k),
                          f, gx);
    } else {
      act.grad_from_sigmoid(load_acc<T>(p, k), g, lookup(grad_tab, p, k), f, gx);
    }
  }
  C10_ALWAYS_INLINE void grad_rounded(const Vec& z, const Vec& g, Vec& f, Vec& gx) const {
    Vec zr;
    const Vec entry = lookup_rounded<T>(grad_tab, z, zr);
    if constexpr (*grad_table(K) == Table::kSlope) {
      gx = g * entry;
      if constexpr (kUse == ActUse::kGradValue) f = lookup_rounded<T>(value_tab, z);
    } else if constexpr (has_tanh_table(K)) {
      act.grad_from_parts(zr, g, lookup_rounded<T>(tanh_tab, z), entry, f, gx);
    } else {
      act.grad_from_sigmoid(zr, g, entry, f, gx);
    }
  }
};

// Calls body(act) for one kernel call that evaluates K's act half `elems` times, with act a
// TabulatedAct where T is bf16 / fp16, the call reads tables (reads_tables: at least
// kLookupMinElems evaluations, T's tables read in its direction) and the tables kUse needs are
// at hand, else a ComputedAct. A kernel writes its loop once, as a generic lambda; it is
// compiled for each kind, so the choice is made once per call.
template <Act K, typename T, ActUse kUse, typename Body>
void with_act(const ActConfig& cfg, int64_t elems, const Body& body) {
  if constexpr (is_half_float<T>) {
    using ActF = typename ActTraits<K, float>::Act;
    if constexpr (kUse == ActUse::kValue && has_value_table(K)) {
      const float* value = reads_tables<T>(elems, true)
                               ? lookup_table<ActF, T, Table::kValue>(cfg) : nullptr;
      if (value != nullptr) {
        body(TabulatedAct<K, T, kUse>{ActF(cfg), value, nullptr, nullptr});
        return;
      }
    } else if constexpr (kUse != ActUse::kValue && grad_table(K).has_value()) {
      if (reads_tables<T>(elems, false)) {
        const float* grad = lookup_table<ActF, T, *grad_table(K)>(cfg);
        const float* value = nullptr;
        constexpr bool kSlopeValue =
            kUse == ActUse::kGradValue && *grad_table(K) == Table::kSlope;
        if constexpr (kSlopeValue) value = lookup_table<ActF, T, Table::kValue>(cfg);
        const float* tanh = nullptr;
        if constexpr (has_tanh_table(K)) tanh = lookup_table<ActF, T, Table::kTanh>(cfg);
        if (grad != nullptr && (!kSlopeValue || value != nullptr) &&
            (!has_tanh_table(K) || tanh != nullptr)) {
          body(TabulatedAct<K, T, kUse>{ActF(cfg), value, grad, tanh});
          return;
        }
      }
    }
  }
  body(ComputedAct<K, T>(cfg));
}

}  // namespace te_cpp::cpu
