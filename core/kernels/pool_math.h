// Per-element pooling math shared by pool_cpu.cc and pool_cuda.cu (host and device), so that both backends
// compute every output with the same operations in the same order (core/kernels/pool.h states the
// semantics). Private to core/kernels.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/kernels/pool.h"

namespace dpe::kernels::detail {

DPE_HOST_DEVICE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
DPE_HOST_DEVICE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// A window of input rows [begin, end) (already clipped to the input).
struct Range {
  int64_t begin, end;
};

DPE_HOST_DEVICE Range window(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t in) {
  const int64_t start = o * stride - pad;
  return {max64(start, 0), min64(start + k, in)};
}

// The outputs whose window (in padded coordinates) contains input position i: [begin, end).
DPE_HOST_DEVICE Range outputs_covering(int64_t i, int64_t k, int64_t stride, int64_t pad, int64_t out) {
  const int64_t begin = i + pad < k ? 0 : (i + pad - k) / stride + 1;
  return {begin, min64((i + pad) / stride + 1, out)};
}

// Adaptive pooling: input rows [floor(o * in / out), ceil((o + 1) * in / out)).
DPE_HOST_DEVICE Range adaptive_window(int64_t o, int64_t in, int64_t out) {
  return {o * in / out, ((o + 1) * in + out - 1) / out};
}

// The adaptive outputs whose window contains input row i: o in [floor(i * out / in), ceil((i + 1) * out / in)),
// each then checked against adaptive_window (the bounds are exact; the check keeps this obviously right).
DPE_HOST_DEVICE Range adaptive_outputs_covering(int64_t i, int64_t in, int64_t out) {
  return {i * out / in, min64(((i + 1) * out + in - 1) / in, out)};
}

// plane: (H, W). Max over the window of output (oi, oj); writes the flat index of the first maximum (a NaN
// wins and stops the search, as in PyTorch).
template <typename T>
DPE_HOST_DEVICE T max_window(const Pool2dShape& s, const T* plane, int64_t oi, int64_t oj, int64_t* index) {
  const Range r = window(oi, s.kh, s.stride_h, s.pad_h, s.h);
  const Range c = window(oj, s.kw, s.stride_w, s.pad_w, s.w);
  int64_t best_index = r.begin * s.w + c.begin;
  T best = plane[best_index];
  for (int64_t i = r.begin; i < r.end; ++i) {
    for (int64_t j = c.begin; j < c.end; ++j) {
      const T v = plane[i * s.w + j];
      if (v > best || v != v) {
        best = v;
        best_index = i * s.w + j;
        if (v != v) {
          *index = best_index;
          return best;
        }
      }
    }
  }
  *index = best_index;
  return best;
}

// count_include_pad = True divisor of output (oi, oj): the window clipped to the padded input.
DPE_HOST_DEVICE int64_t avg_divisor(const Pool2dShape& s, int64_t oi, int64_t oj) {
  const int64_t hs = oi * s.stride_h - s.pad_h, ws = oj * s.stride_w - s.pad_w;
  const int64_t he = min64(hs + s.kh, s.h + s.pad_h), we = min64(ws + s.kw, s.w + s.pad_w);
  return (he - hs) * (we - ws);
}

template <typename T>
DPE_HOST_DEVICE T avg_window(const Pool2dShape& s, const T* plane, int64_t oi, int64_t oj) {
  const Range r = window(oi, s.kh, s.stride_h, s.pad_h, s.h);
  const Range c = window(oj, s.kw, s.stride_w, s.pad_w, s.w);
  T sum = 0;
  for (int64_t i = r.begin; i < r.end; ++i) {
    for (int64_t j = c.begin; j < c.end; ++j) sum += plane[i * s.w + j];
  }
  return sum / static_cast<T>(avg_divisor(s, oi, oj));
}

template <typename T>
DPE_HOST_DEVICE T adaptive_avg_window(const Pool2dShape& s, const T* plane, int64_t oi, int64_t oj) {
  const Range r = adaptive_window(oi, s.h, s.h_out);
  const Range c = adaptive_window(oj, s.w, s.w_out);
  T sum = 0;
  for (int64_t i = r.begin; i < r.end; ++i) {
    for (int64_t j = c.begin; j < c.end; ++j) sum += plane[i * s.w + j];
  }
  return sum / static_cast<T>((r.end - r.begin) * (c.end - c.begin));
}

// ---- backward: dx at input (i, j) of one plane, gathered from dy (H_out, W_out) ----

template <typename T>
DPE_HOST_DEVICE T max_backward_at(const Pool2dShape& s, const T* dy, const int64_t* indices, int64_t i, int64_t j) {
  const Range r = outputs_covering(i, s.kh, s.stride_h, s.pad_h, s.h_out);
  const Range c = outputs_covering(j, s.kw, s.stride_w, s.pad_w, s.w_out);
  const int64_t flat = i * s.w + j;
  T sum = 0;
  for (int64_t oi = r.begin; oi < r.end; ++oi) {
    for (int64_t oj = c.begin; oj < c.end; ++oj) {
      if (indices[oi * s.w_out + oj] == flat) sum += dy[oi * s.w_out + oj];
    }
  }
  return sum;
}

template <typename T>
DPE_HOST_DEVICE T avg_backward_at(const Pool2dShape& s, const T* dy, int64_t i, int64_t j) {
  const Range r = outputs_covering(i, s.kh, s.stride_h, s.pad_h, s.h_out);
  const Range c = outputs_covering(j, s.kw, s.stride_w, s.pad_w, s.w_out);
  T sum = 0;
  for (int64_t oi = r.begin; oi < r.end; ++oi) {
    for (int64_t oj = c.begin; oj < c.end; ++oj) {
      sum += dy[oi * s.w_out + oj] / static_cast<T>(avg_divisor(s, oi, oj));
    }
  }
  return sum;
}

template <typename T>
DPE_HOST_DEVICE T adaptive_avg_backward_at(const Pool2dShape& s, const T* dy, int64_t i, int64_t j) {
  const Range r = adaptive_outputs_covering(i, s.h, s.h_out);
  const Range c = adaptive_outputs_covering(j, s.w, s.w_out);
  T sum = 0;
  for (int64_t oi = r.begin; oi < r.end; ++oi) {
    const Range wr = adaptive_window(oi, s.h, s.h_out);
    if (i < wr.begin || i >= wr.end) continue;
    for (int64_t oj = c.begin; oj < c.end; ++oj) {
      const Range wc = adaptive_window(oj, s.w, s.w_out);
      if (j < wc.begin || j >= wc.end) continue;
      sum += dy[oi * s.w_out + oj] / static_cast<T>((wr.end - wr.begin) * (wc.end - wc.begin));
    }
  }
  return sum;
}

}  // namespace dpe::kernels::detail
