// K x K blocks of a transpose in 16-byte registers (K = 16 / element size: 16x16 for bytes),
// for the transpose_2d kernel. log2(K) rounds of interleaves, one per unit width (the element
// size, 2x, ..., 8 bytes): with the rows taken in bit-reversed order, each round sorts one more
// bit of the row index into place and register j ends as column j. Elements move as bits. Only
// where AVX2 or AVX-512 is compiled (TE_TRANSPOSE_SIMD); without them the kernels take their
// scalar loops.
#pragma once

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>

#include <cstdint>

#define TE_TRANSPOSE_SIMD 1

namespace te_cpp::cpu {

// Interleave of the low (kHigh false) or high halves of a and b in units of W bytes.
template <int W, bool kHigh>
inline __m128i interleave(__m128i a, __m128i b) {
  if constexpr (W == 1) return kHigh ? _mm_unpackhi_epi8(a, b) : _mm_unpacklo_epi8(a, b);
  if constexpr (W == 2) return kHigh ? _mm_unpackhi_epi16(a, b) : _mm_unpacklo_epi16(a, b);
  if constexpr (W == 4) return kHigh ? _mm_unpackhi_epi32(a, b) : _mm_unpacklo_epi32(a, b);
  if constexpr (W == 8) return kHigh ? _mm_unpackhi_epi64(a, b) : _mm_unpacklo_epi64(a, b);
}

// One round per unit width W: v[2i] and v[2i + 1] take the low and high interleaves of v[i]
// and v[i + K/2].
template <int W, int K>
inline void interleave_rounds(__m128i (&v)[K]) {
  if constexpr (W < 16) {
    __m128i t[K];
    for (int i = 0; i < K / 2; ++i) {
      t[2 * i] = interleave<W, false>(v[i], v[i + K / 2]);
      t[2 * i + 1] = interleave<W, true>(v[i], v[i + K / 2]);
    }
    for (int i = 0; i < K; ++i) v[i] = t[i];
    interleave_rounds<2 * W, K>(v);
  }
}

constexpr int bit_reverse(int i, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
  return r;
}

// Elements of T per 16-byte register: the side of a block.
template <typename T>
constexpr int kBlockSide = 16 / static_cast<int>(sizeof(T));

// The K x K block held one row per register (rows[i] = row i) transposed in place: rows[j]
// becomes column j.
template <typename T>
inline void transpose_block(__m128i (&rows)[kBlockSide<T>]) {
  constexpr int S = sizeof(T), K = kBlockSide<T>;
  constexpr int kBits = S == 1 ? 4 : S == 2 ? 3 : S == 4 ? 2 : 1;
  __m128i v[K];
  for (int i = 0; i < K; ++i) v[i] = rows[bit_reverse(i, kBits)];
  interleave_rounds<S, K>(v);
  for (int i = 0; i < K; ++i) rows[i] = v[i];
}

// The K x K block at src (row stride ls elements) transposed to dst (row stride ld elements).
template <typename T>
inline void transpose_block(const T* src, int64_t ls, T* dst, int64_t ld) {
  constexpr int K = kBlockSide<T>;
  __m128i v[K];
  for (int i = 0; i < K; ++i) {
    v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ls));
  }
  transpose_block<T>(v);
  for (int j = 0; j < K; ++j) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j * ld), v[j]);
}

}  // namespace te_cpp::cpu

#endif
