// Row gather and row scatter-add over a (V, D) table by int64 indices: the kernels behind index_select
// (dim 0) and embedding, and their backward. dtype is float32 or float64; every array is contiguous.
//
// Bounds: every index must lie in [0, V). An index outside is the caller's error: the kernel throws
// dpe::Error naming the first offending position, the index and V ("index_select_cpu: index 7 at position 3
// is out of range for a table of 5 rows"), and writes nothing. CPU checks on the host before any write;
// CUDA checks with a small validation kernel whose result is copied back (one stream synchronisation per
// call: correctness over speed, see docs/LAYERS.md).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/kernels/backend_types.h"

namespace dpe::kernels {

// table: (V, D)  indices: (n) int64  out: (n, D);  out[i, :] = table[indices[i], :]
void index_select_cpu(DType dtype, int64_t V, int64_t D, const void* table, int64_t n, const int64_t* indices,
                      void* out);
void index_select_cuda(cudaStream_t stream, DType dtype, int64_t V, int64_t D, const void* table, int64_t n,
                       const int64_t* indices, void* out);

// src: (n, D)  indices: (n) int64  out: (V, D);  out[indices[i], :] += src[i, :] for every i (accumulates
// into out's existing values; repeated indices add up).
// CPU: deterministic (rows are added in order i = 0..n-1 for every column, whatever the thread count).
// CUDA: atomicAdd, so with repeated indices the order of the additions, and therefore the last bits of the
// float sums, may change from run to run (float32 and float64 alike).
void index_add_cpu(DType dtype, int64_t V, int64_t D, int64_t n, const int64_t* indices, const void* src, void* out);
void index_add_cuda(cudaStream_t stream, DType dtype, int64_t V, int64_t D, int64_t n, const int64_t* indices,
                    const void* src, void* out);

}  // namespace dpe::kernels
