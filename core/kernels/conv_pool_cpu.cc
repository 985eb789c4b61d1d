// The convolution, ReLU and 2x2 max-pool in one pass each way (core/kernels/conv_pool.h, Note [Convolution,
// ReLU and pool in one pass]). Eight output channels to an AVX2 vector: the weights are relaid out once per call
// as (tap, C_out rounded up to 8), zero-padded, so every vector load is whole; the input rows a pooled row
// needs are copied with their zero padding, so no tap tests a border.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/kernels/conv_pool.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/pool_window.h"
#include "core/kernels/scratch.h"

namespace dpe::kernels {

#if defined(__AVX2__)
namespace {

using detail::first_lanes;
using detail::load_codes;
using detail::relu_of;
using detail::store_codes;
using detail::window_max;
using detail::WindowMax;

constexpr int64_t kLanes = 8;

int64_t round_up_to_lanes(int64_t v) { return (v + kLanes - 1) / kLanes * kLanes; }

// What both passes derive from the shape: the padded input rows a pooled row reads, and each tap's offset in
// them.
struct Geometry {
  int64_t h_p = 0, w_p = 0;      // pooled output
  int64_t c_pad = 0;             // C_out rounded up to whole vectors
  int64_t taps = 0;              // C_in * kH * kW
  int64_t rows = 0, width = 0;   // padded input rows per pooled row (kH + 1) and their width (W + 2 pad_w)
  std::vector<int64_t> tap_offset;  // tap (ci, i, j) -> (ci * rows + i) * width + j

  explicit Geometry(const Conv2dShape& s)
      : h_p(conv_pool_h(s)), w_p(conv_pool_w(s)), c_pad(round_up_to_lanes(s.c_out)), taps(s.c_in * s.kh * s.kw),
        rows(s.kh + 1), width(s.w + 2 * s.pad_w) {
    for (int64_t ci = 0; ci < s.c_in; ++ci) {
      for (int64_t i = 0; i < s.kh; ++i) {
        for (int64_t j = 0; j < s.kw; ++j) tap_offset.push_back((ci * rows + i) * width + j);
      }
    }
  }
  // Floats of the padded rows.
  int64_t rows_floats(const Conv2dShape& s) const { return s.c_in * rows * width; }
  // Where backward_sample's vectors start in its buffer, after the rows, the candidates' table and dy.
  int64_t backward_vectors_at(const Conv2dShape& s) const {
    return round_up_to_lanes(rows_floats(s) + w_p * taps * 4 + w_p * c_pad);
  }
};

// The input rows under pooled row `oh` of sample n: out[(ci * g.rows + r) * g.width + j] = x[n, ci, 2 oh + r -
// pad_h, j - pad_w], 0 outside the image.
void load_padded_rows(const Conv2dShape& s, const Geometry& g, const float* x, int64_t n, int64_t oh, float* out) {
  for (int64_t ci = 0; ci < s.c_in; ++ci) {
    for (int64_t r = 0; r < g.rows; ++r) {
      float* row = out + (ci * g.rows + r) * g.width;
      const int64_t i = 2 * oh + r - s.pad_h;
      if (i < 0 || i >= s.h) {
        std::fill(row, row + g.width, 0.0f);
        continue;
      }
      std::fill(row, row + s.pad_w, 0.0f);
      std::fill(row + s.pad_w + s.w, row + g.width, 0.0f);
      if (s.channels_last) {
        const float* src = x + (n * s.h + i) * s.w * s.c_in + ci;
        for (int64_t j = 0; j < s.w; ++j) row[s.pad_w + j] = src[j * s.c_in];
      } else {
        std::memcpy(row + s.pad_w, x + ((n * s.c_in + ci) * s.h + i) * s.w, static_cast<size_t>(s.w) * sizeof(float));
      }
    }
  }
}

// The weights as (tap, c_pad): eight output channels of one tap per vector, zeros past C_out.
std::vector<float> weights_by_tap(const Conv2dShape& s, const Geometry& g, const float* w) {
  std::vector<float> out(static_cast<size_t>(g.taps * g.c_pad), 0.0f);
  for (int64_t co = 0; co < s.c_out; ++co) {
    for (int64_t t = 0; t < g.taps; ++t) out[t * g.c_pad + co] = w[co * g.taps + t];
  }
  return out;
}

// Pooled column ow's window maxima for kBlocks vectors of output channels from co: the window's four
// convolution outputs (top-left, top-right, bottom-left, bottom-right) accumulated tap by tap, + bias, then
// pooled and relu'd. rows: the pooled row's padded input rows.
template <int kBlocks>
void window_outputs(const Geometry& g, const float* rows, const float* wt, const float* bias, int64_t co, int64_t ow,
                    WindowMax* out) {
  __m256 acc[kBlocks][4];
  for (auto& block : acc) {
    for (__m256& a : block) a = _mm256_setzero_ps();
  }
  const int64_t below = g.width;
  for (int64_t t = 0; t < g.taps; ++t) {
    const float* p = rows + g.tap_offset[t] + 2 * ow;
    const __m256 x0 = _mm256_broadcast_ss(p), x1 = _mm256_broadcast_ss(p + 1);
    const __m256 x2 = _mm256_broadcast_ss(p + below), x3 = _mm256_broadcast_ss(p + below + 1);
    for (int b = 0; b < kBlocks; ++b) {
      const __m256 wv = _mm256_loadu_ps(wt + t * g.c_pad + co + b * kLanes);
      acc[b][0] = _mm256_fmadd_ps(x0, wv, acc[b][0]);
      acc[b][1] = _mm256_fmadd_ps(x1, wv, acc[b][1]);
      acc[b][2] = _mm256_fmadd_ps(x2, wv, acc[b][2]);
      acc[b][3] = _mm256_fmadd_ps(x3, wv, acc[b][3]);
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    const __m256 bv = _mm256_loadu_ps(bias + co + b * kLanes);
    out[b] = relu_of(window_max(_mm256_add_ps(acc[b][0], bv), _mm256_add_ps(acc[b][1], bv),
                                _mm256_add_ps(acc[b][2], bv), _mm256_add_ps(acc[b][3], bv)));
  }
}

void forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y, uint8_t* codes) {
  const Geometry g(s);
  const std::vector<float> wt = weights_by_tap(s, g, w);
  std::vector<float> bias(static_cast<size_t>(g.c_pad), 0.0f);
  if (b != nullptr) std::copy(b, b + s.c_out, bias.begin());
  const int64_t blocks = g.c_pad / kLanes, row_floats = g.rows_floats(s);
  detail::parallel_tasks(s.n * g.h_p, g.w_p * g.c_pad * g.taps * 4, [&](int64_t task) {
    const int64_t n = task / g.h_p, oh = task % g.h_p;
    // The padded rows, then (NCHW only) the pooled row channels last, to be transposed into its planes.
    detail::ScratchBuffer buffer = detail::scratch(static_cast<size_t>(row_floats + g.w_p * g.c_pad) * sizeof(float));
    DPE_CHECK(buffer != nullptr, "conv2d_relu_max_pool2d_cpu: out of memory for a row buffer");
    float* rows = static_cast<float*>(buffer.get());
    float* staged = rows + row_floats;
    load_padded_rows(s, g, x, n, oh, rows);
    uint8_t* code_row = codes + task * g.w_p * s.c_out;
    float* y_row = s.channels_last ? y + task * g.w_p * s.c_out : staged;
    const int64_t y_stride = s.channels_last ? s.c_out : g.c_pad;
    for (int64_t ow = 0; ow < g.w_p; ++ow) {
      for (int64_t block = 0; block < blocks;) {
        // Two blocks at a time where there are two: eight independent sums keep both FMA pipes busy.
        WindowMax m[2];
        const int count = block + 1 < blocks ? 2 : 1;
        if (count == 2) {
          window_outputs<2>(g, rows, wt.data(), bias.data(), block * kLanes, ow, m);
        } else {
          window_outputs<1>(g, rows, wt.data(), bias.data(), block * kLanes, ow, m);
        }
        for (int k = 0; k < count; ++k, ++block) {
          const int64_t co = block * kLanes, lanes = std::min(kLanes, s.c_out - co);
          float* out = y_row + ow * y_stride + co;
          if (lanes == kLanes || !s.channels_last) {
            _mm256_storeu_ps(out, m[k].value);  // staged rows have c_pad columns
          } else {
            _mm256_maskstore_ps(out, first_lanes(lanes), m[k].value);
          }
          store_codes(code_row + ow * s.c_out + co, m[k].code, static_cast<int32_t>(lanes));
        }
      }
    }
    if (!s.channels_last) {
      for (int64_t co = 0; co < s.c_out; ++co) {
        float* plane_row = y + ((n * s.c_out + co) * g.h_p + oh) * g.w_p;
        for (int64_t ow = 0; ow < g.w_p; ++ow) plane_row[ow] = staged[ow * g.c_pad + co];
      }
    }
  });
}

// One sample's weight and bias gradients, added into sums ((tap, c_pad), then c_pad for the bias); the bias's
// alone where x is null.
void backward_sample(const Conv2dShape& s, const Geometry& g, const float* x, const float* dy, const uint8_t* codes,
                     int64_t n, float* sums, float* scratch_rows) {
  float* rows = scratch_rows;
  float* table = rows + g.rows_floats(s);       // (w_p, taps, 4): each tap's input under the four candidates
  float* grad = table + g.w_p * g.taps * 4;     // (w_p, c_pad): the pooled row's dy, channels last
  // One vector of channels of the row: its dy where a winner is, and its codes
  // (aligned: a multiple of 8 floats from the buffer's 64-byte aligned start).
  auto* won = reinterpret_cast<__m256*>(rows + g.backward_vectors_at(s));
  auto* code = reinterpret_cast<__m256i*>(won + g.w_p);
  const int64_t blocks = g.c_pad / kLanes;
  const int64_t taps = x != nullptr ? g.taps : 0;
  for (int64_t oh = 0; oh < g.h_p; ++oh) {
    if (taps > 0) load_padded_rows(s, g, x, n, oh, rows);
    for (int64_t ow = 0; ow < g.w_p && taps > 0; ++ow) {
      for (int64_t t = 0; t < taps; ++t) {
        const float* p = rows + g.tap_offset[t] + 2 * ow;
        float* entry = table + (ow * g.taps + t) * 4;
        entry[0] = p[0];
        entry[1] = p[1];
        entry[2] = p[g.width];
        entry[3] = p[g.width + 1];
      }
    }
    const int64_t row = n * g.h_p + oh;
    for (int64_t ow = 0; ow < g.w_p; ++ow) {
      float* out = grad + ow * g.c_pad;
      if (s.channels_last) {
        std::copy(dy + (row * g.w_p + ow) * s.c_out, dy + (row * g.w_p + ow + 1) * s.c_out, out);
      } else {
        for (int64_t co = 0; co < s.c_out; ++co) out[co] = dy[((n * s.c_out + co) * g.h_p + oh) * g.w_p + ow];
      }
      std::fill(out + s.c_out, out + g.c_pad, 0.0f);
    }
    const uint8_t* code_row = codes + row * g.w_p * s.c_out;
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t co = block * kLanes, lanes = std::min(kLanes, s.c_out - co);
      __m256 bias_sum = _mm256_loadu_ps(sums + g.taps * g.c_pad + co);
      for (int64_t ow = 0; ow < g.w_p; ++ow) {
        code[ow] = load_codes(code_row + ow * s.c_out + co, lanes);
        // dy where the window has a winner, +0 where it has none (kNoWinner).
        won[ow] = _mm256_and_ps(_mm256_loadu_ps(grad + ow * g.c_pad + co),
                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kNoWinner), code[ow])));
        bias_sum = _mm256_add_ps(bias_sum, won[ow]);
      }
      _mm256_storeu_ps(sums + g.taps * g.c_pad + co, bias_sum);
      for (int64_t t = 0; t < taps; ++t) {
        __m256 sum = _mm256_loadu_ps(sums + t * g.c_pad + co);
        for (int64_t ow = 0; ow < g.w_p; ++ow) {
          // Lane k takes the input under its own winner: the four candidates, twice, indexed by the code (a
          // kNoWinner code picks a candidate, times +0).
          const __m256 candidates =
              _mm256_broadcast_ps(reinterpret_cast<const __m128*>(table + (ow * g.taps + t) * 4));
          sum = _mm256_fmadd_ps(won[ow], _mm256_permutevar8x32_ps(candidates, code[ow]), sum);
        }
        _mm256_storeu_ps(sums + t * g.c_pad + co, sum);
      }
    }
  }
}

void backward(const Conv2dShape& s, const float* x, const float* dy, const uint8_t* codes, float* dw, float* db) {
  const Geometry g(s);
  const int64_t per_sample = (g.taps + 1) * g.c_pad;
  detail::ScratchBuffer buffer = detail::scratch(static_cast<size_t>(s.n * per_sample) * sizeof(float));
  DPE_CHECK(buffer != nullptr, "conv2d_relu_max_pool2d_backward_cpu: out of memory for ", s.n, " samples' sums");
  float* sums = static_cast<float*>(buffer.get());
  const int64_t row_floats = g.backward_vectors_at(s) + 2 * g.w_p * kLanes;  // backward_sample's buffers
  detail::parallel_tasks(s.n, g.h_p * g.w_p * g.c_pad * g.taps * 2, [&](int64_t n) {
    detail::ScratchBuffer rows = detail::scratch(static_cast<size_t>(row_floats) * sizeof(float));
    DPE_CHECK(rows != nullptr, "conv2d_relu_max_pool2d_backward_cpu: out of memory for a row buffer");
    float* mine = sums + n * per_sample;
    std::fill(mine, mine + per_sample, 0.0f);
    backward_sample(s, g, dw != nullptr ? x : nullptr, dy, codes, n, mine, static_cast<float*>(rows.get()));
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
