// CPU reductions over the middle axis of (outer, size, inner), and argmax.
//
// Note [Deterministic CPU reductions]
// Every output is combined in an order fixed by `size` alone: leaves of kLeaf contiguous elements (summed in
// kLanes interleaved partial sums) or kRowLeaf rows, joined by a pairwise tree whose split points are
// multiples of the leaf size. Threads only decide *who* evaluates a subtree (tbb::parallel_invoke on large
// subtrees, tbb::parallel_for over independent outputs), never the order of additions, so results are bit
// identical for any number of threads and any task_arena. The pairwise tree keeps the float32 rounding error
// at about (leaf/lanes + log2(size/leaf)) ulps instead of size ulps: a float32 sum of 1e6 elements stays
// accurate to ~1e-6 relative.
//
// NaN: Sum/Mean propagate it by arithmetic; Max/Min propagate it explicitly (a NaN anywhere gives NaN,
// like PyTorch); argmax returns the first NaN's index.
// Thread-safety: only y/indices are written; x is read-only and must not overlap them.
#include <tbb/parallel_for.h>
#include <tbb/parallel_invoke.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/reduce.h"

namespace dpe::kernels {
namespace {

using detail::tbb_parallel;
using detail::kParallelGrain;  // also: pairwise nodes of >= 2x this many elements split over threads
using detail::parallel_column_tiles;
using detail::parallel_tasks;
using detail::check_axis_dims;
using detail::dispatch_float;

constexpr int64_t kLeaf = 256;    // contiguous elements per leaf of the pairwise tree
constexpr int kLanes = 8;         // interleaved partial sums inside a leaf (one AVX2 float vector)
constexpr int64_t kRowLeaf = 16;  // rows per leaf when reducing over a strided axis
constexpr int64_t kTile = 256;    // columns of `inner` processed together

struct SumCombine {
  template <typename T>
  static T apply(T a, T b) {
    return a + b;
  }
};

// a > b, or a is NaN (then a wins and NaN propagates); b NaN also propagates since a > NaN is false.
struct MaxCombine {
  template <typename T>
  static T apply(T a, T b) {
    return (a > b || a != a) ? a : b;
  }
};

struct MinCombine {
  template <typename T>
  static T apply(T a, T b) {
    return (a < b || a != a) ? a : b;
  }
};

// The split point of a pairwise node over n > leaf items: about n/2, rounded up to a multiple of leaf, so
// that every leaf is full except the last one.
int64_t split_point(int64_t n, int64_t leaf) {
  const int64_t h = (n / 2 + leaf - 1) / leaf * leaf;
  DPE_INTERNAL_ASSERT(h > 0 && h < n, "split ", h, " of ", n);
  return h;
}

// AxisReduction of x[0..n), n >= 1, contiguous (see Note [Deterministic CPU reductions]).
template <typename C, typename T>
T reduce_contiguous(const T* x, int64_t n) {
  if (n <= kLeaf) {
    if (n < kLanes) {
      T r = x[0];
      for (int64_t i = 1; i < n; ++i) r = C::apply(r, x[i]);
      return r;
    }
    T lane[kLanes];
    for (int j = 0; j < kLanes; ++j) lane[j] = x[j];
    int64_t i = kLanes;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) lane[j] = C::apply(lane[j], x[i + j]);
    }
    for (int j = 0; i + j < n; ++j) lane[j] = C::apply(lane[j], x[i + j]);
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int j = 0; j < width; ++j) lane[j] = C::apply(lane[j], lane[j + width]);
    }
    return lane[0];
  }
  const int64_t h = split_point(n, kLeaf);
  T left, right;
  if (n >= 2 * kParallelGrain) {
    tbb_parallel([&] {
      tbb::parallel_invoke([&] { left = reduce_contiguous<C>(x, h); },
                           [&] { right = reduce_contiguous<C>(x + h, n - h); });
    });
  } else {
    left = reduce_contiguous<C>(x, h);
    right = reduce_contiguous<C>(x + h, n - h);
  }
  return C::apply(left, right);
}

// out[0..w) = reduction over rows [0, rows) of x[r * row_stride + j], j < w <= kTile, rows >= 1.
template <typename C, typename T>
void reduce_rows(const T* x, int64_t row_stride, int64_t rows, int64_t w, T* out) {
  if (rows <= kRowLeaf) {
    for (int64_t j = 0; j < w; ++j) out[j] = x[j];
    for (int64_t r = 1; r < rows; ++r) {
      const T* row = x + r * row_stride;
      for (int64_t j = 0; j < w; ++j) out[j] = C::apply(out[j], row[j]);
    }
    return;
  }
  const int64_t h = split_point(rows, kRowLeaf);
  T right[kTile];
  if (rows * w >= 2 * kParallelGrain) {
    tbb_parallel([&] {
      tbb::parallel_invoke([&] { reduce_rows<C>(x, row_stride, h, w, out); },
                           [&] { reduce_rows<C>(x + h * row_stride, row_stride, rows - h, w, right); });
    });
  } else {
    reduce_rows<C>(x, row_stride, h, w, out);
    reduce_rows<C>(x + h * row_stride, row_stride, rows - h, w, right);
  }
  for (int64_t j = 0; j < w; ++j) out[j] = C::apply(out[j], right[j]);
}

// x: (outer, size, inner)  y: (outer, inner), size >= 1.
template <typename C, typename T>
void reduce_axis(int64_t outer, int64_t size, int64_t inner, const T* x, T* y) {
  if (inner == 1) {
    parallel_tasks(outer, size, [&](int64_t o) { y[o] = reduce_contiguous<C>(x + o * size, size); });
    return;
  }
  parallel_column_tiles(outer, size, inner, kTile, [&](int64_t o, int64_t c0, int64_t w) {
    reduce_rows<C>(x + o * size * inner + c0, inner, size, w, y + o * inner + c0);
  });
}

// (value, index) of the first maximum of x[0..n) with NaN as the maximum, n >= 1.
template <typename T>
struct ArgMax {
  T value;
  int64_t index;
};

template <typename T>
bool beats(T candidate, T best) {  // strictly better: later equal values never win
  return best == best && (candidate > best || candidate != candidate);
}

template <typename T>
ArgMax<T> argmax_serial(const T* x, int64_t n, int64_t base) {
  ArgMax<T> best{x[0], base};
  for (int64_t i = 1; i < n && best.value == best.value; ++i) {
    if (beats(x[i], best.value)) best = {x[i], base + i};
  }
  return best;
}

// Long rows are split in fixed blocks, searched in parallel, and the block winners compared in order.
template <typename T>
int64_t argmax_contiguous(const T* x, int64_t n) {
  constexpr int64_t kBlock = 2 * kParallelGrain;
  if (n <= kBlock) return argmax_serial(x, n, 0).index;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<ArgMax<T>> winners(static_cast<size_t>(blocks));
  tbb_parallel([&] {
    tbb::parallel_for(int64_t{0}, blocks, [&](int64_t b) {
      const int64_t begin = b * kBlock;
      winners[b] = argmax_serial(x + begin, std::min(kBlock, n - begin), begin);
    });
  });
  ArgMax<T> best = winners[0];
  for (int64_t b = 1; b < blocks; ++b) {
    if (beats(winners[b].value, best.value)) best = winners[b];
  }
  return best.index;
}

// x: (outer, size, inner)  indices: (outer, inner), size >= 1.
template <typename T>
void argmax_axis(int64_t outer, int64_t size, int64_t inner, const T* x, int64_t* indices) {
  if (inner == 1) {
    parallel_tasks(outer, size, [&](int64_t o) { indices[o] = argmax_contiguous(x + o * size, size); });
    return;
  }
  parallel_column_tiles(outer, size, inner, kTile, [&](int64_t o, int64_t c0, int64_t w) {
    const T* base = x + o * size * inner + c0;
    int64_t* idx = indices + o * inner + c0;
    T best[kTile];
    for (int64_t j = 0; j < w; ++j) {
      best[j] = base[j];
      idx[j] = 0;
    }
    for (int64_t s = 1; s < size; ++s) {
      const T* row = base + s * inner;
      for (int64_t j = 0; j < w; ++j) {
        if (beats(row[j], best[j])) {
          best[j] = row[j];
          idx[j] = s;
        }
      }
    }
  });
}

}  // namespace

// x: (outer, size, inner)  y: (outer, inner)
void reduce_cpu(AxisReduction op, DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, void* y) {
  check_axis_dims("reduce_cpu", outer, size, inner);
  DPE_CHECK(size > 0 || op == AxisReduction::Sum, "reduce_cpu: Mean/Max/Min over an empty axis (size 0, outer ", outer,
            ", inner ", inner, ")");
  if (outer == 0 || inner == 0) return;
  dispatch_float(dtype, "reduce_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    if (size == 0) {
      std::fill(ys, ys + outer * inner, T(0));
      return;
    }
    switch (op) {
      case AxisReduction::Sum: return reduce_axis<SumCombine>(outer, size, inner, xs, ys);
      case AxisReduction::Mean: {
        reduce_axis<SumCombine>(outer, size, inner, xs, ys);
        const T count = static_cast<T>(size);
        for (int64_t i = 0; i < outer * inner; ++i) ys[i] /= count;
        return;
      }
      case AxisReduction::Max: return reduce_axis<MaxCombine>(outer, size, inner, xs, ys);
      case AxisReduction::Min: return reduce_axis<MinCombine>(outer, size, inner, xs, ys);
    }
    DPE_CHECK(false, "reduce_cpu: unknown AxisReduction ", static_cast<int>(op));
  });
}

// x: (outer, size, inner)  indices: (outer, inner)
void argmax_cpu(DType dtype, int64_t outer, int64_t size, int64_t inner, const void* x, int64_t* indices) {
  check_axis_dims("argmax_cpu", outer, size, inner);
  DPE_CHECK(size >= 1, "argmax_cpu: empty axis (size 0, outer ", outer, ", inner ", inner, ")");
  if (outer == 0 || inner == 0) return;
  dispatch_float(dtype, "argmax_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    argmax_axis(outer, size, inner, static_cast<const T*>(x), indices);
  });
}

}  // namespace dpe::kernels
