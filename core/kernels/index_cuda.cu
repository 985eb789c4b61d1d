// CUDA row gather / scatter-add (core/kernels/index.h).
//
// Bounds: a validation kernel records the smallest position holding an index outside [0, V) (atomicMin
// into one device word); the host copies that word back on the stream and synchronises, then throws with
// the index. Only after a clean check do the gather/scatter kernels run, so a bad call writes nothing.
// index_add uses atomicAdd (float32 and float64, sm_60+): not deterministic with repeated indices.
#include <cstdint>

#include "core/kernels/cuda_launch.cuh"
#include "core/kernels/index.h"

namespace dpe::kernels {
namespace {

using detail::dispatch_compute_type;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::kBlock;

// indices: (n)  first_bad: 1 word, initialised to all ones; ends as the smallest bad position (or all ones).
__global__ void find_bad_index_kernel(int64_t n, const int64_t* indices, int64_t V,
                                      unsigned long long* first_bad) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t v = indices[i];
    if (v < 0 || v >= V) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// Throws naming the first index outside [0, V). Synchronises `stream`.
// indices: (n) on the device
void check_indices(cudaStream_t stream, const char* what, int64_t V, int64_t D, int64_t n, const int64_t* indices) {
  DPE_CHECK(V >= 0 && D >= 0 && n >= 0, what, ": negative size in V ", V, ", D ", D, ", n ", n);
  if (n == 0) return;
  DPE_CHECK(indices != nullptr, what, ": null indices for n ", n);
  unsigned long long* flag = nullptr;
  DPE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(unsigned long long), stream));
  unsigned long long host_flag = ~0ULL;
  int64_t bad_index = 0;
  try {
    DPE_CUDA_CHECK(cudaMemsetAsync(flag, 0xFF, sizeof(unsigned long long), stream));
    find_bad_index_kernel<<<grid_for(n), kBlock, 0, stream>>>(n, indices, V, flag);
    DPE_CUDA_CHECK_LAUNCH();
    DPE_CUDA_CHECK(cudaMemcpyAsync(&host_flag, flag, sizeof(host_flag), cudaMemcpyDeviceToHost, stream));
    DPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (host_flag < static_cast<unsigned long long>(n)) {
      DPE_CUDA_CHECK(cudaMemcpyAsync(&bad_index, indices + host_flag, sizeof(int64_t), cudaMemcpyDeviceToHost,
                                     stream));
      DPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  } catch (...) {
    cudaFreeAsync(flag, stream);  // best effort: already failing
    throw;
  }
  DPE_CUDA_CHECK(cudaFreeAsync(flag, stream));
  DPE_CHECK(host_flag >= static_cast<unsigned long long>(n), what, ": index ", bad_index, " at position ",
            host_flag, " is out of range for a table of ", V, " rows");
}

// table: (V, D)  indices: (n)  out: (n, D)
template <typename T>
__global__ void index_select_kernel(int64_t D, const T* table, int64_t n, const int64_t* indices, T* out) {
  const int64_t total = n * D;
  for (int64_t e = first_index(); e < total; e += grid_stride()) {
    const int64_t i = e / D, c = e % D;
    out[e] = table[indices[i] * D + c];
  }
}

// src: (n, D)  indices: (n)  out: (V, D)
template <typename T>
__global__ void index_add_kernel(int64_t D, int64_t n, const int64_t* indices, const T* src, T* out) {
  const int64_t total = n * D;
  for (int64_t e = first_index(); e < total; e += grid_stride()) {
    const int64_t i = e / D, c = e % D;
    atomicAdd(out + indices[i] * D + c, src[e]);
  }
}

}  // namespace

// table: (V, D)  indices: (n)  out: (n, D)
void index_select_cuda(cudaStream_t stream, DType dtype, int64_t V, int64_t D, const void* table, int64_t n,
                       const int64_t* indices, void* out) {
  check_indices(stream, "index_select_cuda", V, D, n, indices);
  if (n == 0 || D == 0) return;
  dispatch_compute_type(dtype, "index_select_cuda", [&](auto tag) {
    using T = decltype(tag);
    index_select_kernel<T><<<grid_for(n * D), kBlock, 0, stream>>>(D, static_cast<const T*>(table), n, indices,
                                                                    static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

// src: (n, D)  indices: (n)  out: (V, D)
void index_add_cuda(cudaStream_t stream, DType dtype, int64_t V, int64_t D, int64_t n, const int64_t* indices,
                    const void* src, void* out) {
  check_indices(stream, "index_add_cuda", V, D, n, indices);
  if (n == 0 || D == 0) return;
  dispatch_compute_type(dtype, "index_add_cuda", [&](auto tag) {
    using T = decltype(tag);
    index_add_kernel<T><<<grid_for(n * D), kBlock, 0, stream>>>(D, n, indices, static_cast<const T*>(src),
                                                                 static_cast<T*>(out));
    DPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dpe::kernels
