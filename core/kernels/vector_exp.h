// exp of eight float32 values at once on CPU, and a loop that applies a lane-wise function eight elements at a
// time (core/kernels/*_cpu.cc only).
//
// Note [Eight exps at once]
// SiLU, sigmoid and softmax / log-softmax (rows of 32 or more: softmax_cpu.cc says why) spend their time in expf,
// which GCC does not vectorize without -ffast-math (SiLU's backward took 3.6 ms of a 50 ms tiny-llama step on one
// core). They call glibc's vector expf instead (libmvec's _ZGVdN8v_expf, AVX2: 8 lanes; core/BUILD links -lmvec):
// within 3 ulp of the scalar expf over [-100, 100] (4M values measured), about 6x faster on 1M elements. map8 puts
// every element through it, the last few of a range too (padded to 8 lanes), so an element's bits do not depend on
// where a parallel split falls. Callers keep the rest of their formula operation for operation (math.h's; no FMA
// contraction). float64 and CUDA keep the scalar math; a build without AVX2 too. Against CUDA's
// expf (about 2 ulp), kernels_parity_test allows 8 eps of |y| + |x| (16 eps of the backward's terms): an exp error
// of 3 ulp enters sigmoid scaled by s (1 - s) <= 1/4 and SiLU by |x| times that, well inside it.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>

extern "C" __m256 _ZGVdN8v_expf(__m256);
#endif

namespace dpe::kernels::detail {

#if defined(__AVX2__)
// Note [Lanes libmvec sends to the scalar expf]
// libmvec's vector expf hands every lane beyond |x| ~ 87.3 to the scalar expf, one call per lane: 3.3 ms per 1M
// elements of -inf and 7.5 of -200, against 0.26 in range (measured). A causal softmax feeds it -inf for half of
// every row (the masked scores minus the row maximum): tiny-llama's attention mask and softmax took 2.6 ms a
// layer, 0.94 with what follows. exp8 answers the lanes whose result is known without it: +0 below kExpZeroBelow
// (expf rounds to +0 there: e^x < 2^-150 below -103.97), +inf above kExpInfAbove (beyond ln(FLT_MAX) = 88.72); the
// same bits as expf, and libmvec computes those lanes as exp(0) in the meantime: 0.37 ms per 1M elements of -inf
// or -200. A vector with every lane within |x| <= 87 skips the blends after one compare, which costs in-range
// vectors about 15% (0.244 -> 0.284 ms per 1M). NaN, and the denormal and near-overflow results in between, still
// go to libmvec's slow lanes.
inline constexpr float kExpZeroBelow = -104.0f;
inline constexpr float kExpInfAbove = 89.0f;

inline __m256 exp8(__m256 x) {
  // Every lane within libmvec's own range (NaN is not): one compare and a branch that is almost always taken.
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  if (_mm256_movemask_ps(_mm256_cmp_ps(magnitude, _mm256_set1_ps(87.0f), _CMP_NLE_UQ)) == 0) {
    return _ZGVdN8v_expf(x);
  }
  const __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(kExpZeroBelow), _CMP_LT_OQ);  // false for NaN
  const __m256 inf = _mm256_cmp_ps(x, _mm256_set1_ps(kExpInfAbove), _CMP_GT_OQ);
  const __m256 e = _ZGVdN8v_expf(_mm256_andnot_ps(_mm256_or_ps(zero, inf), x));
  return _mm256_blendv_ps(_mm256_andnot_ps(zero, e), _mm256_set1_ps(__builtin_inff()), inf);
}

// out[i] = f(a[i], b[i]) for i in [begin, end), eight at a time (b may be null: f gets zeros); the last
// partial group through a padded copy. out may be a or b (each group is read before it is written).
template <typename F>
void map8(const float* a, const float* b, float* out, int64_t begin, int64_t end, const F& f) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), b ? _mm256_loadu_ps(b + i) : _mm256_setzero_ps()));
  }
  if (i == end) return;
  alignas(32) float pa[8] = {}, pb[8] = {}, po[8];
  std::copy(a + i, a + end, pa);
  if (b) std::copy(b + i, b + end, pb);
  _mm256_store_ps(po, f(_mm256_load_ps(pa), _mm256_load_ps(pb)));
  std::copy(po, po + (end - i), out + i);
}
#endif

}  // namespace dpe::kernels::detail
