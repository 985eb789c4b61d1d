// The convolution, ReLU and 2x2 max-pool in one pass each way (core/kernels/conv_pool.h, Note [Convolution,
// ReLU and pool in one pass]). Output channels in vector lanes: the weights are relaid out once per call as
// (tap, C_out rounded up to whole vectors), zero-padded, so every vector load is whole; each sample's input is
// copied with its zero padding, so no tap tests a border. One task per sample.
//
// Note [AVX-512 where the CPU has it]
// dpe compiles for x86-64-v3 (AVX2). The row functions below exist twice, eight lanes (AVX2) and sixteen
// (AVX-512, in a `#pragma GCC target` region, so nothing else in the binary uses those instructions), and the
// AVX-512 ones run where the CPU has AVX-512F: half the instructions for the same sums. Both give the same
// bits: each lane is one output channel, and its sums run in the contract's order whatever the width.
// DPE_MAX_CPU_ISA=avx2 keeps the AVX2 functions on an AVX-512 CPU (Note [The CPU instruction-set cap],
// core/cpu_isa.h; the tests run both).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu_isa.h"
#include "core/kernels/conv_pool.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/pool_window.h"
#include "core/kernels/scratch.h"

namespace dpe::kernels {

#if defined(__AVX2__)
namespace {

int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

// Note [AVX-512 where the CPU has it].
bool use_avx512() { return cpu_isa() >= CpuIsa::Avx512; }

// What both passes derive from the shape and the vector width: a sample's padded input, each tap's offset in it,
// and the buffers of a row.
struct Geometry {
  int64_t lanes = 0;             // floats per vector: 16 where use_avx512(), else 8 (AVX2)
  int64_t h_p = 0, w_p = 0;      // pooled output
  int64_t c_pad = 0;             // C_out rounded up to whole vectors
  int64_t taps = 0;              // C_in * kH * kW
  int64_t height = 0, width = 0;  // a sample's padded input plane: (H + 2 pad_h, W + 2 pad_w)
  std::vector<int64_t> tap_offset;  // tap (ci, i, j) -> (ci * height + i) * width + j

  explicit Geometry(const Conv2dShape& s)
      : lanes(use_avx512() ? 16 : 8), h_p(conv_pool_h(s)), w_p(conv_pool_w(s)), c_pad(round_up(s.c_out, lanes)),
        taps(s.c_in * s.kh * s.kw), height(s.h + 2 * s.pad_h), width(s.w + 2 * s.pad_w) {
    for (int64_t ci = 0; ci < s.c_in; ++ci) {
      for (int64_t i = 0; i < s.kh; ++i) {
        for (int64_t j = 0; j < s.kw; ++j) tap_offset.push_back((ci * height + i) * width + j);
      }
    }
  }
  // Floats of a sample's padded input.
  int64_t image_floats(const Conv2dShape& s) const { return s.c_in * height * width; }
  // A backward task's buffer (floats): the padded input, an NCHW dy row channels last (w_p, c_pad), then at a
  // whole vector from the buffer's 64-byte aligned start, one vector of dy and one of codes per column.
  int64_t backward_vectors_at(const Conv2dShape& s) const { return round_up(image_floats(s) + w_p * c_pad, lanes); }
  int64_t backward_floats(const Conv2dShape& s) const { return backward_vectors_at(s) + 2 * w_p * lanes; }
};

// Sample n's input with its zero padding: out[(ci * g.height + i) * g.width + j] = x[n, ci, i - pad_h, j - pad_w],
// 0 outside the image.
void load_padded_image(const Conv2dShape& s, const Geometry& g, const float* x, int64_t n, float* out) {
  std::fill(out, out + g.image_floats(s), 0.0f);
  for (int64_t ci = 0; ci < s.c_in; ++ci) {
    for (int64_t i = 0; i < s.h; ++i) {
      float* row = out + (ci * g.height + i + s.pad_h) * g.width + s.pad_w;
      if (s.channels_last) {
        const float* src = x + (n * s.h + i) * s.w * s.c_in + ci;
        for (int64_t j = 0; j < s.w; ++j) row[j] = src[j * s.c_in];
      } else {
        std::memcpy(row, x + ((n * s.c_in + ci) * s.h + i) * s.w, static_cast<size_t>(s.w) * sizeof(float));
      }
    }
  }
}

// The weights as (tap, c_pad): a vector of output channels of one tap per load, zeros past C_out.
std::vector<float> weights_by_tap(const Conv2dShape& s, const Geometry& g, const float* w) {
  std::vector<float> out(static_cast<size_t>(g.taps * g.c_pad), 0.0f);
  for (int64_t co = 0; co < s.c_out; ++co) {
    for (int64_t t = 0; t < g.taps; ++t) out[t * g.c_pad + co] = w[co * g.taps + t];
  }
  return out;
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols, eight by eight in registers: NCHW's
// per-row transposes (a pooled row's outputs into their planes, its dy out of them), 448 scalar moves a row of
// the CNN's first layer otherwise. Reads and writes nothing outside those elements.
void transpose_tile(const float* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const __m256i row_mask = detail::first_lanes(std::min<int64_t>(8, rows - r0));
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const int64_t width = std::min<int64_t>(8, cols - c0);
      const __m256i col_mask = detail::first_lanes(width);
      __m256 v[8];
      for (int64_t i = 0; i < 8; ++i) {
        v[i] = r0 + i < rows ? _mm256_maskload_ps(src + (r0 + i) * src_stride + c0, col_mask) : _mm256_setzero_ps();
      }
      const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
      const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
      const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
      const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
      // Column c0 + j of the eight rows.
      const __m256 column[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                                _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                                _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                                _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int64_t j = 0; j < width; ++j) _mm256_maskstore_ps(dst + (c0 + j) * dst_stride + r0, row_mask, column[j]);
    }
  }
}

// What a forward row function reads and writes: the padded input from the pooled row's first input row, the
// weights and bias (c_pad), the row's outputs (y_stride floats apart per column; a partial last vector is
// stored masked when masked_tail, else whole: the staging buffer has c_pad columns) and its codes (C_out per
// column).
struct ForwardRow {
  const float* image;
  const float* wt;
  const float* bias;
  float* y;
  int64_t y_stride;
  bool masked_tail;
  uint8_t* codes;
};

// What a backward row function reads: the padded input from the pooled row's first input row, the row's dy
// (grad_stride floats apart per column; a partial last vector is read masked) and its codes; it adds the weight
// gradients of the first `taps` taps and the bias gradient into sums ((tap, c_pad), then c_pad), using `vectors`
// (2 * w_p vectors, aligned) for each column's dy and codes.
struct BackwardRow {
  const float* image;
  const float* grad;
  int64_t grad_stride;
  const uint8_t* codes;
  int64_t taps;
  float* sums;
  float* vectors;
};

// The inputs under a window's four candidates for one tap, (top-left, top-right, bottom-left, bottom-right):
// two pairs of neighbours, p[0..2) and p[width..width + 2).
__m128 candidates_at(const float* p, int64_t width) {
  // Each pair as one 8-byte load through memcpy: the pairs are not 8-byte aligned, which _mm_load_sd's dereference
  // does not allow (UBSan), and GCC compiles this to a load and an insert (the backward 0.38 ms per 64 images where
  // _mm_load_sd + _mm_loadh_pi took 0.44 and _mm_loadl_pi + _mm_loadh_pi 0.45, measured in turn).
  double top, bottom;
  std::memcpy(&top, p, sizeof(double));
  std::memcpy(&bottom, p + width, sizeof(double));
  return _mm_castpd_ps(_mm_set_pd(bottom, top));
}

// The backward sums taps in groups: one running sum per tap of the group, so that a column's FMAs do not wait
// for each other (a single sum over the columns was one dependent FMA per column, latency-bound).
constexpr int64_t kTapGroup = 4;

// Calls body(std::integral_constant<int64_t, k>) for k = min(kTapGroup, remaining).
template <typename F>
void tap_group(int64_t remaining, const F& body) {
  switch (std::min(kTapGroup, remaining)) {
    case 4: return body(std::integral_constant<int64_t, 4>{});
    case 3: return body(std::integral_constant<int64_t, 3>{});
    case 2: return body(std::integral_constant<int64_t, 2>{});
    default: return body(std::integral_constant<int64_t, 1>{});
  }
}

// ---- Eight lanes (AVX2) ----

using detail::first_lanes;
using detail::load_codes;
using detail::relu_of;
using detail::store_codes;
using detail::window_max;
using detail::WindowMax;

// Pooled column ow's window maxima for kBlocks vectors of output channels from co: the window's four
// convolution outputs (top-left, top-right, bottom-left, bottom-right) accumulated tap by tap, + bias, then
// pooled and relu'd.
template <int kBlocks>
void window_outputs_avx2(const Geometry& g, const ForwardRow& row, int64_t co, int64_t ow, WindowMax* out) {
  __m256 acc[kBlocks][4];
  for (auto& block : acc) {
    for (__m256& a : block) a = _mm256_setzero_ps();
  }
  for (int64_t t = 0; t < g.taps; ++t) {
    const float* p = row.image + g.tap_offset[t] + 2 * ow;
    const __m256 x0 = _mm256_broadcast_ss(p), x1 = _mm256_broadcast_ss(p + 1);
    const __m256 x2 = _mm256_broadcast_ss(p + g.width), x3 = _mm256_broadcast_ss(p + g.width + 1);
    for (int b = 0; b < kBlocks; ++b) {
      const __m256 wv = _mm256_loadu_ps(row.wt + t * g.c_pad + co + b * 8);
      acc[b][0] = _mm256_fmadd_ps(x0, wv, acc[b][0]);
      acc[b][1] = _mm256_fmadd_ps(x1, wv, acc[b][1]);
      acc[b][2] = _mm256_fmadd_ps(x2, wv, acc[b][2]);
      acc[b][3] = _mm256_fmadd_ps(x3, wv, acc[b][3]);
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    const __m256 bv = _mm256_loadu_ps(row.bias + co + b * 8);
    out[b] = relu_of(window_max(_mm256_add_ps(acc[b][0], bv), _mm256_add_ps(acc[b][1], bv),
                                _mm256_add_ps(acc[b][2], bv), _mm256_add_ps(acc[b][3], bv)));
  }
}

void forward_row_avx2(const Conv2dShape& s, const Geometry& g, const ForwardRow& row) {
  const int64_t blocks = g.c_pad / 8;
  for (int64_t ow = 0; ow < g.w_p; ++ow) {
    for (int64_t block = 0; block < blocks;) {
      // Two blocks at a time where there are two: eight independent sums keep both FMA pipes busy.
      WindowMax m[2];
      const int count = block + 1 < blocks ? 2 : 1;
      if (count == 2) {
        window_outputs_avx2<2>(g, row, block * 8, ow, m);
      } else {
        window_outputs_avx2<1>(g, row, block * 8, ow, m);
      }
      for (int k = 0; k < count; ++k, ++block) {
        const int64_t co = block * 8, lanes = std::min<int64_t>(8, s.c_out - co);
        float* out = row.y + ow * row.y_stride + co;
        if (lanes == 8 || !row.masked_tail) {
          _mm256_storeu_ps(out, m[k].value);
        } else {
          _mm256_maskstore_ps(out, first_lanes(lanes), m[k].value);
        }
        store_codes(row.codes + ow * s.c_out + co, m[k].code, static_cast<int32_t>(lanes));
      }
    }
  }
}

void backward_row_avx2(const Conv2dShape& s, const Geometry& g, const BackwardRow& row) {
  auto* won = reinterpret_cast<__m256*>(row.vectors);
  auto* code = reinterpret_cast<__m256i*>(won + g.w_p);
  for (int64_t co = 0; co < g.c_pad; co += 8) {
    const int64_t lanes = std::min<int64_t>(8, s.c_out - co);
    __m256 bias_sum = _mm256_loadu_ps(row.sums + g.taps * g.c_pad + co);
    for (int64_t ow = 0; ow < g.w_p; ++ow) {
      code[ow] = load_codes(row.codes + ow * s.c_out + co, lanes);
      // dy where the window has a winner, +0 where it has none (kNoWinner).
      won[ow] = _mm256_and_ps(_mm256_maskload_ps(row.grad + ow * row.grad_stride + co, first_lanes(lanes)),
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kNoWinner), code[ow])));
      bias_sum = _mm256_add_ps(bias_sum, won[ow]);
    }
    _mm256_storeu_ps(row.sums + g.taps * g.c_pad + co, bias_sum);
    for (int64_t t = 0; t < row.taps; t += kTapGroup) {
      tap_group(row.taps - t, [&](auto group) {
        constexpr int64_t kGroup = decltype(group)::value;
        __m256 sum[kGroup];
        for (int64_t k = 0; k < kGroup; ++k) sum[k] = _mm256_loadu_ps(row.sums + (t + k) * g.c_pad + co);
        for (int64_t ow = 0; ow < g.w_p; ++ow) {
          const float* window = row.image + 2 * ow;
          for (int64_t k = 0; k < kGroup; ++k) {
            // Lane j takes the input under its own winner: the four candidates, twice, indexed by the code (a
            // kNoWinner code picks a candidate, times +0).
            const __m128 four = candidates_at(window + g.tap_offset[t + k], g.width);
            const __m256 candidates = _mm256_set_m128(four, four);
            sum[k] = _mm256_fmadd_ps(won[ow], _mm256_permutevar8x32_ps(candidates, code[ow]), sum[k]);
          }
        }
        for (int64_t k = 0; k < kGroup; ++k) _mm256_storeu_ps(row.sums + (t + k) * g.c_pad + co, sum[k]);
      });
    }
  }
}

// ---- Sixteen lanes (AVX-512F) ----

#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12's avx512fintrin.h passes an undefined vector as the unused source of cvtepu8_epi32, broadcast_f32x4 and
// permutexvar_ps, which -Wmaybe-uninitialized reports at every use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// pool_window.h's window_max and relu_of on sixteen lanes, with masks for the comparisons: the same rule (the
// first maximum in window order wins, a NaN wins; relu: x <= 0 -> +0 and kNoWinner).
struct WindowMax16 {
  __m512 value;
  __m512i code;
};

__mmask16 second_wins16(__m512 first, __m512 second) {
  return _mm512_cmp_ps_mask(second, first, _CMP_GT_OQ) |
         (_mm512_cmp_ps_mask(second, second, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(first, first, _CMP_ORD_Q));
}

WindowMax16 relu_of_window_max16(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __mmask16 top_right = second_wins16(a, b), bottom_right = second_wins16(c, d);
  const __m512 upper = _mm512_mask_blend_ps(top_right, a, b), lower = _mm512_mask_blend_ps(bottom_right, c, d);
  const __mmask16 bottom = second_wins16(upper, lower);
  const __m512i upper_code = _mm512_maskz_mov_epi32(top_right, _mm512_set1_epi32(1));
  const __m512i lower_code = _mm512_mask_mov_epi32(_mm512_set1_epi32(2), bottom_right, _mm512_set1_epi32(3));
  const __m512 value = _mm512_mask_blend_ps(bottom, upper, lower);
  const __m512i code = _mm512_mask_blend_epi32(bottom, upper_code, lower_code);
  const __mmask16 dead = _mm512_cmp_ps_mask(value, _mm512_setzero_ps(), _CMP_LE_OQ);
  return {_mm512_mask_blend_ps(dead, value, _mm512_setzero_ps()),
          _mm512_mask_blend_epi32(dead, code, _mm512_set1_epi32(kNoWinner))};
}

__mmask16 first_lanes16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

template <int kBlocks>
void window_outputs_avx512(const Geometry& g, const ForwardRow& row, int64_t co, int64_t ow, WindowMax16* out) {
  __m512 acc[kBlocks][4];
  for (auto& block : acc) {
    for (__m512& a : block) a = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < g.taps; ++t) {
    const float* p = row.image + g.tap_offset[t] + 2 * ow;
    const __m512 x0 = _mm512_set1_ps(p[0]), x1 = _mm512_set1_ps(p[1]);
    const __m512 x2 = _mm512_set1_ps(p[g.width]), x3 = _mm512_set1_ps(p[g.width + 1]);
    for (int b = 0; b < kBlocks; ++b) {
      const __m512 wv = _mm512_loadu_ps(row.wt + t * g.c_pad + co + b * 16);
      acc[b][0] = _mm512_fmadd_ps(x0, wv, acc[b][0]);
      acc[b][1] = _mm512_fmadd_ps(x1, wv, acc[b][1]);
      acc[b][2] = _mm512_fmadd_ps(x2, wv, acc[b][2]);
      acc[b][3] = _mm512_fmadd_ps(x3, wv, acc[b][3]);
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    const __m512 bv = _mm512_loadu_ps(row.bias + co + b * 16);
    out[b] = relu_of_window_max16(_mm512_add_ps(acc[b][0], bv), _mm512_add_ps(acc[b][1], bv),
                                  _mm512_add_ps(acc[b][2], bv), _mm512_add_ps(acc[b][3], bv));
  }
}

void forward_row_avx512(const Conv2dShape& s, const Geometry& g, const ForwardRow& row) {
  const int64_t blocks = g.c_pad / 16;
  for (int64_t ow = 0; ow < g.w_p; ++ow) {
    for (int64_t block = 0; block < blocks;) {
      WindowMax16 m[2];
      const int count = block + 1 < blocks ? 2 : 1;
      if (count == 2) {
        window_outputs_avx512<2>(g, row, block * 16, ow, m);
      } else {
        window_outputs_avx512<1>(g, row, block * 16, ow, m);
      }
      for (int k = 0; k < count; ++k, ++block) {
        const int64_t co = block * 16, lanes = std::min<int64_t>(16, s.c_out - co);
        const __mmask16 mask = first_lanes16(lanes);
        _mm512_mask_storeu_ps(row.y + ow * row.y_stride + co, row.masked_tail ? mask : __mmask16{0xffff},
                              m[k].value);
        _mm512_mask_cvtepi32_storeu_epi8(row.codes + ow * s.c_out + co, mask, m[k].code);
      }
    }
  }
}

void backward_row_avx512(const Conv2dShape& s, const Geometry& g, const BackwardRow& row) {
  auto* won = reinterpret_cast<__m512*>(row.vectors);
  auto* code = reinterpret_cast<__m512i*>(won + g.w_p);
  for (int64_t co = 0; co < g.c_pad; co += 16) {
    const int64_t lanes = std::min<int64_t>(16, s.c_out - co);
    __m512 bias_sum = _mm512_loadu_ps(row.sums + g.taps * g.c_pad + co);
    for (int64_t ow = 0; ow < g.w_p; ++ow) {
      alignas(16) uint8_t bytes[16] = {};
      // lanes is in [1, 16]; the clamp says so to GCC's -Wstringop-overflow.
      std::memcpy(bytes, row.codes + ow * s.c_out + co, static_cast<size_t>(std::clamp<int64_t>(lanes, 1, 16)));
      code[ow] = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes)));
      // dy where the window has a winner, +0 where it has none (kNoWinner).
      won[ow] = _mm512_maskz_mov_ps(_mm512_cmplt_epi32_mask(code[ow], _mm512_set1_epi32(kNoWinner)),
                                    _mm512_maskz_loadu_ps(first_lanes16(lanes), row.grad + ow * row.grad_stride + co));
      bias_sum = _mm512_add_ps(bias_sum, won[ow]);
    }
    _mm512_storeu_ps(row.sums + g.taps * g.c_pad + co, bias_sum);
    for (int64_t t = 0; t < row.taps; t += kTapGroup) {
      tap_group(row.taps - t, [&](auto group) {
        constexpr int64_t kGroup = decltype(group)::value;
        __m512 sum[kGroup];
        for (int64_t k = 0; k < kGroup; ++k) sum[k] = _mm512_loadu_ps(row.sums + (t + k) * g.c_pad + co);
        for (int64_t ow = 0; ow < g.w_p; ++ow) {
          const float* window = row.image + 2 * ow;
          for (int64_t k = 0; k < kGroup; ++k) {
            // The four candidates four times, indexed by the code (kNoWinner picks one, times +0).
            const __m512 candidates = _mm512_broadcast_f32x4(candidates_at(window + g.tap_offset[t + k], g.width));
            sum[k] = _mm512_fmadd_ps(won[ow], _mm512_permutexvar_ps(code[ow], candidates), sum[k]);
          }
        }
        for (int64_t k = 0; k < kGroup; ++k) _mm512_storeu_ps(row.sums + (t + k) * g.c_pad + co, sum[k]);
      });
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

// ---- The passes ----

void forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y, uint8_t* codes) {
  const Geometry g(s);
  const std::vector<float> wt = weights_by_tap(s, g, w);
  std::vector<float> bias(static_cast<size_t>(g.c_pad), 0.0f);
  if (b != nullptr) std::copy(b, b + s.c_out, bias.begin());
  const int64_t image_floats = g.image_floats(s);
  detail::parallel_tasks(s.n, g.h_p * g.w_p * g.c_pad * g.taps * 4, [&](int64_t n) {
    // The padded input, then (NCHW only) a pooled row channels last, to be transposed into its planes.
    detail::ScratchBuffer buffer = detail::scratch(static_cast<size_t>(image_floats + g.w_p * g.c_pad) * sizeof(float));
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, buffer != nullptr,
                   "conv2d_relu_max_pool2d_cpu: out of memory for a sample's buffer");
    float* image = static_cast<float*>(buffer.get());
    float* staged = image + image_floats;
    load_padded_image(s, g, x, n, image);
    for (int64_t oh = 0; oh < g.h_p; ++oh) {
      const int64_t row_index = n * g.h_p + oh;
      const ForwardRow row{image + 2 * oh * g.width,
                           wt.data(),
                           bias.data(),
                           s.channels_last ? y + row_index * g.w_p * s.c_out : staged,
                           s.channels_last ? s.c_out : g.c_pad,
                           s.channels_last,
                           codes + row_index * g.w_p * s.c_out};
      (g.lanes == 16 ? forward_row_avx512 : forward_row_avx2)(s, g, row);
      if (!s.channels_last) {
        transpose_tile(staged, g.c_pad, g.w_p, s.c_out, y + (n * s.c_out * g.h_p + oh) * g.w_p, g.h_p * g.w_p);
      }
    }
  });
}

// One sample's weight and bias gradients, added into sums ((tap, c_pad), then c_pad for the bias); the bias's
// alone where x is null. buffer: g.backward_floats(s), 64-byte aligned.
void backward_sample(const Conv2dShape& s, const Geometry& g, const float* x, const float* dy, const uint8_t* codes,
                     int64_t n, float* sums, float* buffer) {
  float* image = buffer;
  float* staged = image + g.image_floats(s);  // NCHW: the pooled row's dy, channels last (w_p, c_pad)
  const int64_t taps = x != nullptr ? g.taps : 0;
  if (taps > 0) load_padded_image(s, g, x, n, image);
  for (int64_t oh = 0; oh < g.h_p; ++oh) {
    const int64_t row = n * g.h_p + oh;
    if (!s.channels_last) {
      transpose_tile(dy + (n * s.c_out * g.h_p + oh) * g.w_p, g.h_p * g.w_p, s.c_out, g.w_p, staged, g.c_pad);
    }
    const BackwardRow args{image + 2 * oh * g.width,
                           s.channels_last ? dy + row * g.w_p * s.c_out : staged,
                           s.channels_last ? s.c_out : g.c_pad,
                           codes + row * g.w_p * s.c_out,
                           taps,
                           sums,
                           buffer + g.backward_vectors_at(s)};
    (g.lanes == 16 ? backward_row_avx512 : backward_row_avx2)(s, g, args);
  }
}

void backward(const Conv2dShape& s, const float* x, const float* dy, const uint8_t* codes, float* dw, float* db) {
  const Geometry g(s);
  const int64_t per_sample = (g.taps + 1) * g.c_pad;
  detail::ScratchBuffer buffer = detail::scratch(static_cast<size_t>(s.n * per_sample) * sizeof(float));
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, buffer != nullptr, "conv2d_relu_max_pool2d_backward_cpu: out of memory for ",
                 s.n, " samples' sums");
  float* sums = static_cast<float*>(buffer.get());
  detail::parallel_tasks(s.n, g.h_p * g.w_p * g.c_pad * g.taps * 2, [&](int64_t n) {
    detail::ScratchBuffer mem = detail::scratch(static_cast<size_t>(g.backward_floats(s)) * sizeof(float));
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, mem != nullptr,
                   "conv2d_relu_max_pool2d_backward_cpu: out of memory for a sample's buffer");
    float* mine = sums + n * per_sample;
    std::fill(mine, mine + per_sample, 0.0f);
    backward_sample(s, g, dw != nullptr ? x : nullptr, dy, codes, n, mine, static_cast<float*>(mem.get()));
  });
  // The samples' sums in sample order.
  for (int64_t n = 1; n < s.n; ++n) {
    const float* theirs = sums + n * per_sample;
    for (int64_t k = 0; k < per_sample; ++k) sums[k] += theirs[k];
  }
  if (dw != nullptr) {
    for (int64_t co = 0; co < s.c_out; ++co) {
      for (int64_t t = 0; t < g.taps; ++t) dw[co * g.taps + t] = sums[t * g.c_pad + co];
    }
  }
  if (db != nullptr) std::copy(sums + g.taps * g.c_pad, sums + g.taps * g.c_pad + s.c_out, db);
}

}  // namespace
#endif  // __AVX2__

bool conv2d_relu_max_pool2d_applies(const Conv2dShape& s) {
#if defined(__AVX2__)
  return s.dtype == DType::Float32 && !s.f32_activations && s.groups == 1 && s.stride_h == 1 && s.stride_w == 1 &&
         s.dil_h == 1 && s.dil_w == 1 && s.c_in * s.kh * s.kw <= kConvPoolMaxProducts && s.h_out() >= 2 &&
         s.w_out() >= 2 && s.n > 0;
#else
  (void)s;
  return false;
#endif
}

void conv2d_relu_max_pool2d_cpu(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                                uint8_t* codes) {
  check_conv2d_shape("conv2d_relu_max_pool2d_cpu", s);
  DPE_INTERNAL_ASSERT(conv2d_relu_max_pool2d_applies(s), "conv2d_relu_max_pool2d_cpu does not take this shape");
#if defined(__AVX2__)
  forward(s, x, w, b, y, codes);
#endif
}

void conv2d_relu_max_pool2d_backward_cpu(const Conv2dShape& s, const float* x, const float* dy, const uint8_t* codes,
                                         float* dw, float* db) {
  check_conv2d_shape("conv2d_relu_max_pool2d_backward_cpu", s);
  DPE_INTERNAL_ASSERT(conv2d_relu_max_pool2d_applies(s),
                      "conv2d_relu_max_pool2d_backward_cpu does not take this shape");
#if defined(__AVX2__)
  if (dw == nullptr && db == nullptr) return;
  backward(s, x, dy, codes, dw, db);
#endif
}

}  // namespace dpe::kernels
