// How the CPU kernels spread work over threads (core/kernels/*_cpu.cc only; needs oneTBB).
//
// Contract: these helpers decide only *which thread* runs a piece of work, never what a piece computes or in
// which order one output is combined. Each body they run must compute its elements (or tasks) independently
// of the others, so results are bit-identical for any number of threads, any task_arena and any split TBB
// picks. Kernels that combine many elements into one output (reduce_cpu.cc) fix that order themselves and
// use these helpers only over independent outputs.
// Work runs under tbb::parallel_for in the caller's task_arena.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>
#include <typeinfo>

namespace dpe::kernels::detail {

// Runs `parallel`, a call of a oneTBB parallel algorithm. oneTBB reports a worker thread it could not start
// (the process limit of `ulimit -u`, memory) as a plain std::runtime_error ("pthread_create has failed: ...")
// out of the algorithm that wanted the worker; the bodies of dpe's kernels throw dpe::Error, std::bad_alloc or
// std::system_error, never a plain std::runtime_error. That one becomes what a thread that cannot be created
// is everywhere else in dpe, a std::system_error with EAGAIN (the dpe tool: exit status 3, "out of memory or
// threads"), instead of an exception no caller can tell from a bug.
template <typename F>
void tbb_parallel(F&& parallel) {
  try {
    parallel();
  } catch (const std::runtime_error& e) {
    if (typeid(e) != typeid(std::runtime_error)) throw;
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            std::string("oneTBB could not start a worker thread (") + e.what() + ")");
  }
}

// Elements of work below which a kernel runs on the calling thread, and about how many each parallel
// chunk gets above it. One value for every CPU kernel (copy, elementwise, random, reduce, softmax all used
// 32768 when each file had its own copy), so that their thresholds agree.
inline constexpr int64_t kParallelGrain = 32768;

// Calls body(begin, end) on ranges that together cover [0, n) exactly once: [0, n) on the calling thread
// when n <= kParallelGrain, else chunks of about kParallelGrain under tbb::parallel_for.
template <typename F>
void parallel_range(int64_t n, const F& body) {
  if (n <= kParallelGrain) {
    body(int64_t{0}, n);
    return;
  }
  tbb_parallel([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kParallelGrain),
                      [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
  });
}

// Calls body(task) once for each task in [0, tasks), where each task is about work_per_task elements of
// work: tasks are grouped so that a chunk does about kParallelGrain elements, and all of them stay on the
// calling thread when their total work fits in one chunk.
template <typename F>
void parallel_tasks(int64_t tasks, int64_t work_per_task, const F& body) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, work_per_task));
  if (tasks <= grain) {
    for (int64_t t = 0; t < tasks; ++t) body(t);
    return;
  }
  tbb_parallel([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, tasks, grain), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t t = r.begin(); t < r.end(); ++t) body(t);
    });
  });
}

// For kernels over the middle axis of (outer, size, inner), inner >= 1: splits the outputs into independent
// tasks, one per (outer index o, tile of up to `tile` consecutive inner columns starting at c0), and calls
// body(o, c0, w) for each, w being the tile's width (inner == 1: one task per row). Each task reads `size`
// rows of w columns.
template <typename F>
void parallel_column_tiles(int64_t outer, int64_t size, int64_t inner, int64_t tile, const F& body) {
  const int64_t tiles = (inner + tile - 1) / tile;
  parallel_tasks(outer * tiles, size * std::min(inner, tile), [&](int64_t t) {
    const int64_t o = t / tiles, c0 = t % tiles * tile;
    body(o, c0, std::min(tile, inner - c0));
  });
}

}  // namespace dpe::kernels::detail
