// The 2x2 max-pool's window arithmetic on eight float32 lanes (AVX2), shared by the window-code pooling kernels
// (pool_cpu.cc) and the fused convolution, ReLU and pool (conv_pool_cpu.cc): which candidate wins a window
// (Note [2x2 max-pool] in pool_cpu.cc), the ReLU of the maxima, and the window codes (Note [Window codes],
// pool.h) stored as bytes. core/kernels/*_cpu.cc only.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/kernels/pool.h"

namespace dpe::kernels::detail {

// Lanes where `second` beats `first` under max_window's rule: larger, or a NaN where `first` is not one (the
// first NaN wins).
inline __m256 second_wins(__m256 first, __m256 second) {
  const __m256 larger = _mm256_cmp_ps(second, first, _CMP_GT_OQ);
  const __m256 nan_over_number =
      _mm256_and_ps(_mm256_cmp_ps(second, second, _CMP_UNORD_Q), _mm256_cmp_ps(first, first, _CMP_ORD_Q));
  return _mm256_or_ps(larger, nan_over_number);
}

// A 2x2 window's maximum under max_window's rule (Note [2x2 max-pool]) from its candidates in window order, a
// top-left, b top-right, c bottom-left, d bottom-right, and the winner's place, 2 * row + column (int32 lanes).
struct WindowMax {
  __m256 value;
  __m256i code;
};

inline WindowMax window_max(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 top_right = second_wins(a, b), bottom_right = second_wins(c, d);
  const __m256 upper = _mm256_blendv_ps(a, b, top_right), lower = _mm256_blendv_ps(c, d, bottom_right);
  const __m256 bottom = second_wins(upper, lower);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i upper_code = _mm256_and_si256(_mm256_castps_si256(top_right), one);
  const __m256i lower_code =
      _mm256_or_si256(_mm256_set1_epi32(2), _mm256_and_si256(_mm256_castps_si256(bottom_right), one));
  const __m256i code = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(upper_code), _mm256_castsi256_ps(lower_code), bottom));
  return {_mm256_blendv_ps(upper, lower, bottom), code};
}

// relu of the window maxima (Pool2dShape::relu): x <= 0 -> +0 with code kNoWinner (relu's gradient there is
// 0); NaN, which relu keeps and passes dy through, is left alone.
inline WindowMax relu_of(const WindowMax& m) {
  const __m256 dead = _mm256_cmp_ps(m.value, _mm256_setzero_ps(), _CMP_LE_OQ);
  return {_mm256_blendv_ps(m.value, _mm256_setzero_ps(), dead),
          _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(m.code),
                                               _mm256_castsi256_ps(_mm256_set1_epi32(kNoWinner)), dead))};
}

// Stores lanes [0, n) of eight int32 codes (0..3, kNoWinner) as bytes.
inline void store_codes(uint8_t* out, __m256i code, int32_t n) {
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  const __m128i bytes = _mm_packus_epi16(words, words);
  if (n == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
  } else {
    alignas(16) uint8_t tail[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tail), bytes);
    std::memcpy(out, tail, static_cast<size_t>(n));
  }
}

// Lanes [0, n) of eight codes as int32 lanes, reading no byte past them.
inline __m256i load_codes(const uint8_t* in, int64_t n) {
  if (n == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in)));
  uint64_t packed = 0;
  for (int64_t k = 0; k < n; ++k) packed |= uint64_t{in[k]} << (8 * k);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(packed)));
}

// The first n of eight lanes.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// dy where `code` names `place` (0..3), +0 elsewhere: dy's bits selected, not multiplied, so a NaN or -0 dy
// arrives as it is, like the scatter's.
inline __m256 gradient_at(__m256 dy, __m256i code, int place) {
  return _mm256_and_ps(dy, _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, _mm256_set1_epi32(place))));
}

}  // namespace dpe::kernels::detail

#endif  // __AVX2__
