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
inline __m256 exp8(__m256 x) { return _ZGVdN8v_expf(x); }

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
