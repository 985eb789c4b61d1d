// CPU row gather / scatter-add (core/kernels/index.h). Indices are validated on the host before anything
// is written. index_add parallelises over column tiles only, so each output element receives its
// contributions in index order i = 0..n-1: bit-identical results for any thread count.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/kernels/arg_checks.h"
#include "core/kernels/cpu_parallel.h"
#include "core/kernels/dtype_dispatch.h"
#include "core/kernels/index.h"

namespace dpe::kernels {
namespace {

using detail::parallel_tasks;
using detail::dispatch_float;

// indices: (n); throws naming the first index outside [0, V).
void check_indices(const char* what, int64_t V, int64_t D, int64_t n, const int64_t* indices) {
  DPE_CHECK(V >= 0 && D >= 0 && n >= 0, what, ": negative size in V ", V, ", D ", D, ", n ", n);
  DPE_CHECK(n == 0 || indices != nullptr, what, ": null indices for n ", n);
  for (int64_t i = 0; i < n; ++i) {
    DPE_CHECK(indices[i] >= 0 && indices[i] < V, what, ": index ", indices[i], " at position ", i,
              " is out of range for a table of ", V, " rows");
  }
}

// Columns per task of index_add: wide enough to amortise the index loop, narrow enough to split D.
constexpr int64_t kColumnTile = 256;

}  // namespace

// table: (V, D)  indices: (n)  out: (n, D)
void index_select_cpu(DType dtype, int64_t V, int64_t D, const void* table, int64_t n, const int64_t* indices,
                      void* out) {
  check_indices("index_select_cpu", V, D, n, indices);
  if (n == 0 || D == 0) return;
  DPE_CHECK(table != nullptr && out != nullptr, "index_select_cpu: null table or out for n ", n, ", D ", D);
  dispatch_float(dtype, "index_select_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* t = static_cast<const T*>(table);
    T* o = static_cast<T*>(out);
    // Each task copies one row: independent outputs.
    parallel_tasks(n, D, [&](int64_t i) { std::memcpy(o + i * D, t + indices[i] * D, sizeof(T) * D); });
  });
}

// src: (n, D)  indices: (n)  out: (V, D)
void index_add_cpu(DType dtype, int64_t V, int64_t D, int64_t n, const int64_t* indices, const void* src,
                   void* out) {
  check_indices("index_add_cpu", V, D, n, indices);
  if (n == 0 || D == 0) return;
  DPE_CHECK(src != nullptr && out != nullptr, "index_add_cpu: null src or out for n ", n, ", D ", D);
  dispatch_float(dtype, "index_add_cpu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src);
    T* o = static_cast<T*>(out);
    const int64_t tiles = (D + kColumnTile - 1) / kColumnTile;
    // Task = one column tile; within it rows are added in order i = 0..n-1 (deterministic).
    parallel_tasks(tiles, n * std::min(D, kColumnTile), [&](int64_t tile) {
      const int64_t c0 = tile * kColumnTile, c1 = std::min(D, c0 + kColumnTile);
      for (int64_t i = 0; i < n; ++i) {
        const T* row = s + i * D;
        T* dst = o + indices[i] * D;
        for (int64_t c = c0; c < c1; ++c) dst[c] += row[c];
      }
    });
  });
}

}  // namespace dpe::kernels
