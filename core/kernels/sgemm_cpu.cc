// float32 GEMM on CPU: three libraries, and the choice between them (core/kernels/sgemm_choice.h).
//
// Note [float32 GEMM choice]
// Candidates (all maintained libraries, nothing hand-written):
//  - onednn-sgemm: oneDNN's dnnl_sgemm. JIT-compiled for the CPU it finds (AVX-512 here, though dpe is built
//    for AVX2), so no environment variable decides its speed. dpe's only float32 GEMM before the choice.
//  - onednn-matmul: oneDNN's matmul primitive (brgemm kernels), built once per shape, scalars and thread
//    share, and cached. Also JIT, also environment-proof. Measured 2026-11-25 on the 2-core AVX-512 VM, it
//    beats dnnl_sgemm on two threads where dnnl_sgemm does not use them well (B transposed, n = 10).
//  - openblas: cblas_sgemm. OpenBLAS (Debian's DYNAMIC_ARCH build) picks its kernel once, when it is loaded,
//    from OPENBLAS_CORETYPE if that is set, else from cpuid; there is no call to change it afterwards
//    (OpenBLAS's FAQ: the variable and openblas_get_corename() are the interface), and Debian ships no
//    per-CPU builds for amd64. These machines set OPENBLAS_CORETYPE=Haswell, which halves it on AVX-512
//    cores; dpe does not override another library's process-wide setting (an application embedding dpe may
//    rely on it). So OpenBLAS is one candidate among three, measured as it was loaded: it wins where it is
//    faster and loses where the environment made it slow.
//    Threads: OpenBLAS's thread count is process-wide (openblas_set_num_threads), not the calling thread's,
//    so it is a candidate only where the caller's share is one thread and OpenBLAS's pool is one thread
//    (`dpe` sets OPENBLAS_NUM_THREADS=1): it then runs on the calling worker, as a device's GEMM must.
//
// The policy (DPE_CPU_SGEMM, set_sgemm_policy()):
//  - "onednn", the default: a fixed rule (onednn_rule): oneDNN's matmul primitive for A @ B^T with A not
//    transposed and at least kMatmulPrimitiveFlops per matrix, dnnl_sgemm for everything else. A @ B^T is
//    nn::Linear's forward (the weight is (out, in), as in PyTorch), where dnnl_sgemm is slowest: on the
//    MLP's x @ W^T at batch 256 it reached 226-229 GFLOP/s on one core against the primitive's 246-250 (and
//    356-381 against 459-495 on two threads for 512 x 512), while on the MLP's backward products the two are
//    within 3% of each other, and dnnl_sgemm is far faster on its 10-wide weight gradient (199 against 122);
//    the primitive everywhere made the backward 2-5% slower (one core, the MLP's step at batch 256).
//    Below the threshold the primitive's few microseconds per call (cache lookup, memory objects, execute)
//    lose: tiny-llama's attention scores (64 x 64 x 32, 0.26 MFLOP) ran at 134 GFLOP/s on dnnl_sgemm and 55
//    on the primitive; at 2e7 FLOP (~80 us on one core) they are under 4% of the product. A shape's first
//    call builds its primitive (onednn_matmul_cpu.cc caches it): 0.2 ms more than a cached call, averaged
//    over 30 batch sizes of the MLP's first layer, so changing batch sizes cost little.
//    bench/matmul_bench prints all of it, with the rule's pick per shape; docs/BENCHMARKS.md has the runs.
//  - "onednn-sgemm", "onednn-matmul", "openblas": one library for every shape.
//  - "auto": the first time a (m, n, k, trans_a, trans_b, threads) is seen, every eligible candidate runs it
//    on the caller's A and B into a scratch C, interleaved, 3 to 10 rounds (each round >= 0.2 ms of calls per
//    candidate, until the rounds took >= 30 ms), and the best time of each counts. The fastest wins, except
//    that onednn-sgemm keeps the shape unless another candidate is at least 10% faster: closer than that is
//    within this machine's run-to-run noise. The choice is kept for the process (a map behind a mutex, one
//    std::once_flag per shape: threads needing the same shape wait for one measurement; different shapes
//    measure in parallel). Cost: ~3-10 calls per candidate, once per shape.
// Why "auto" is not the default: a choice made by timing can differ between two runs on a busy machine (and
// between the processes of one MPI run), and two libraries round differently, so a checkpoint resumed under
// "auto" did not repeat the uninterrupted run byte for byte (tools/dpe/dpe_train_mpi_test.sh failed so,
// 2026-11-25), which docs/RELIABILITY.md promises. PyTorch keeps cudnn.benchmark off by default for the same
// reason. "onednn" looks at the shape alone, so every run and process makes the same choices.
// What was chosen: sgemm_choices() (`dpe bench` prints them; so does bench/matmul_bench).
//
// Threads: oneDNN parallelises with OpenMP using omp_get_max_threads() of the *calling* thread (each device
// worker sets its share once, docs/DESIGN.md); the matmul primitives are cached per share. Primitives are
// immutable and their scratchpad is allocated per call (scratchpad_mode::user), so one may run on several
// workers at once. Calls on distinct C matrices are safe from any number of threads.
#include "core/kernels/sgemm_choice.h"

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/kernels/onednn.h"

namespace dpe::kernels {

std::string_view sgemm_backend_name(SgemmBackend backend) {
  switch (backend) {
    case SgemmBackend::OnednnSgemm:
      return "onednn-sgemm";
    case SgemmBackend::OnednnMatmul:
      return "onednn-matmul";
    case SgemmBackend::OpenBlas:
      return "openblas";
  }
  DPE_INTERNAL_ASSERT(false, "unknown SgemmBackend ", static_cast<int>(backend));
}

std::string_view sgemm_policy_name(SgemmPolicy policy) {
  switch (policy) {
    case SgemmPolicy::Onednn:
      return "onednn";
    case SgemmPolicy::Auto:
      return "auto";
    default:
      return sgemm_backend_name(*forced_backend(policy));
  }
}

std::optional<SgemmBackend> forced_backend(SgemmPolicy policy) {
  switch (policy) {
    case SgemmPolicy::OnednnSgemm:
      return SgemmBackend::OnednnSgemm;
    case SgemmPolicy::OnednnMatmul:
      return SgemmBackend::OnednnMatmul;
    case SgemmPolicy::OpenBlas:
      return SgemmBackend::OpenBlas;
    case SgemmPolicy::Onednn:
    case SgemmPolicy::Auto:
      return std::nullopt;
  }
  DPE_INTERNAL_ASSERT(false, "unknown SgemmPolicy ", static_cast<int>(policy));
}

SgemmPolicy forcing(SgemmBackend backend) {
  for (SgemmPolicy p : kSgemmPolicies) {
    if (forced_backend(p) == backend) return p;
  }
  DPE_INTERNAL_ASSERT(false, "unknown SgemmBackend ", static_cast<int>(backend));
}

SgemmBackend onednn_rule(const GemmArgs& g) {
  const bool a_times_b_transposed = g.trans_a == Transpose::No && g.trans_b == Transpose::Yes;
  return a_times_b_transposed && detail::matrix_flops(g) >= kMatmulPrimitiveFlops ? SgemmBackend::OnednnMatmul
                                                                                  : SgemmBackend::OnednnSgemm;
}

SgemmPolicy parse_sgemm_policy(std::string_view text) {
  for (SgemmPolicy p : kSgemmPolicies) {
    if (text == sgemm_policy_name(p)) return p;
  }
  DPE_CHECK(false, "DPE_CPU_SGEMM='", text,
            "' is not a float32 GEMM policy; expected onednn, auto, onednn-sgemm, onednn-matmul or openblas");
  return kDefaultSgemmPolicy;  // not reached
}

SgemmPolicy sgemm_policy_from_env() {
  const char* env = std::getenv("DPE_CPU_SGEMM");
  if (env == nullptr || *env == '\0') return kDefaultSgemmPolicy;
  return parse_sgemm_policy(env);
}

namespace {

// set_sgemm_policy's policy as an int, or kNoPolicySet (follow DPE_CPU_SGEMM).
constexpr int kNoPolicySet = -1;
std::atomic<int> policy_set{kNoPolicySet};

char trans_char(Transpose t) { return t == Transpose::Yes ? 'T' : 'N'; }
CBLAS_TRANSPOSE cblas_trans(Transpose t) { return t == Transpose::Yes ? CblasTrans : CblasNoTrans; }

// ---------------------------------------------------------------------------------------------------------
// The candidates. a: op -> (m, k)  b: op -> (k, n)  c: (m, n), all row-major with the given row strides.

// dnnl_sgemm generates its JIT kernels lazily, for the process: nearly all on its first call (~6 MB of address
// space), a little on the first call of some variants (+132 KB for a transposed A that reads C). The first
// call of each variant (the transposes, whether C is read) checks the address space first (Note [Exceptions
// and oneDNN], measure 3).
std::atomic<unsigned> sgemm_variants_built{0};  // bit (trans_a, trans_b, beta != 0) set after a call succeeded

void onednn_sgemm(const GemmArgs& g, const float* a, const float* b, float* c) {
  const unsigned variant = 1u << ((g.trans_a == Transpose::Yes ? 4 : 0) + (g.trans_b == Transpose::Yes ? 2 : 0) +
                                  (g.beta != 0.0 ? 1 : 0));
  const bool first = (sgemm_variants_built.load(std::memory_order_relaxed) & variant) == 0;
  auto context = [&] { return dpe::detail::str_cat("in dnnl_sgemm (m ", g.m, ", n ", g.n, ", k ", g.k, ")"); };
  if (first) detail::check_space_for_onednn_build("gemm_cpu", context());
  // A C API, but C++ inside: what it throws (out of memory in its lazy initialisation or JIT buffers) is
  // turned into a dpe::Error here, and its status is checked after it returns (Note [Exceptions and oneDNN]).
  dnnl_status_t status = dnnl_success;
  try {
    status = dnnl_sgemm(trans_char(g.trans_a), trans_char(g.trans_b), g.m, g.n, g.k, static_cast<float>(g.alpha), a,
                        g.lda, b, g.ldb, static_cast<float>(g.beta), c, g.ldc);
  } catch (...) {
    detail::rethrow_onednn_failure("gemm_cpu", context());
  }
  // The arguments were validated by gemm_cpu, so oneDNN rejecting them is our bug; anything else (out of
  // memory) is reported as an error.
  DPE_INTERNAL_ASSERT(status != dnnl_invalid_arguments, "dnnl_sgemm rejected m ", g.m, ", n ", g.n, ", k ", g.k,
                      ", lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc);
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, status != dnnl_out_of_memory,
                 "gemm_cpu: out of memory inside oneDNN (dnnl_sgemm returned ", dnnl_status2str(status), ") for m ",
                 g.m, ", n ", g.n, ", k ", g.k);
  DPE_CHECK(status == dnnl_success, "dnnl_sgemm failed: ", dnnl_status2str(status), " (m ", g.m, ", n ", g.n,
            ", k ", g.k, ")");
  if (first) sgemm_variants_built.fetch_or(variant, std::memory_order_relaxed);
}

bool fits_int(const GemmArgs& g) {
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    if (v > INT_MAX) return false;
  }
  return true;
}

// Note [OpenBLAS and address-space limits]
// OpenBLAS (0.3.21) maps a 128 MiB work buffer (BUFFER_SIZE) the first time a thread needs one and keeps it
// for the process; when that mmap fails, blas_memory_alloc retries forever (a busy loop: `dpe train` under
// `ulimit -v` hung there, tools/dpe/dpe_errors_test.sh). So before a thread's first OpenBLAS product dpe
// reserves twice that much address space itself (PROT_NONE, nothing committed) and releases it: where that
// fails, OpenBLAS is not used on this thread (the measured choice falls back to onednn-sgemm, a forced
// openblas is an out-of-memory error). Another thread could take the space in between; the check makes the
// hang unlikely, not impossible, which is one more reason OpenBLAS is never the default for a shape
// unless it measured clearly faster.
thread_local bool openblas_ran_here = false;  // an OpenBLAS product finished on this thread: it has a buffer

bool openblas_buffer_mappable() {
  if (openblas_ran_here) return true;
  constexpr size_t kTwoBuffers = size_t{2} << 27;
  void* p = mmap(nullptr, kTwoBuffers, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, kTwoBuffers);
  return true;
}

void openblas_sgemm(const GemmArgs& g, const float* a, const float* b, float* c) {
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, openblas_buffer_mappable(),
                 "gemm_cpu: out of memory: OpenBLAS needs a 128 MiB work buffer per thread "
                 "and the address space for it cannot be mapped (m ",
                 g.m, ", n ", g.n, ", k ", g.k, "; Note [OpenBLAS and address-space limits])");
  // cblas takes 32-bit ints (Debian's libopenblas0 is the LP64 build).
  DPE_CHECK(fits_int(g), "gemm_cpu: OpenBLAS needs sizes and leading dimensions that fit in int; got m ", g.m,
            ", n ", g.n, ", k ", g.k, ", lda ", g.lda, ", ldb ", g.ldb, ", ldc ", g.ldc);
  cblas_sgemm(CblasRowMajor, cblas_trans(g.trans_a), cblas_trans(g.trans_b), static_cast<int>(g.m),
              static_cast<int>(g.n), static_cast<int>(g.k), static_cast<float>(g.alpha), a, static_cast<int>(g.lda),
              b, static_cast<int>(g.ldb), static_cast<float>(g.beta), c, static_cast<int>(g.ldc));
  openblas_ran_here = true;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// ---------------------------------------------------------------------------------------------------------
// The measured choice (Note [float32 GEMM choice]).

using ChoiceKey = std::tuple<int64_t, int64_t, int64_t, int, int, int>;

struct ChoiceEntry {
  std::once_flag measured;
  SgemmBackend backend = SgemmBackend::OnednnSgemm;
};

struct ChoiceTable {
  std::mutex mutex;
  std::map<ChoiceKey, std::unique_ptr<ChoiceEntry>> entries;  // entries are never removed: pointers stay valid
  std::vector<SgemmChoice> made;                              // in the order measured
};

ChoiceTable& choice_table() {
  static auto* table = new ChoiceTable;  // never destroyed: workers may still run at exit
  return *table;
}

bool eligible(SgemmBackend backend, const GemmArgs& g, int threads) {
  if (backend != SgemmBackend::OpenBlas) return true;
  return threads == 1 && openblas_get_num_threads() == 1 && fits_int(g) && openblas_buffer_mappable();
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

SgemmChoice measure(const GemmArgs& g, int threads) {
  SgemmChoice choice{g.m, g.n, g.k, g.trans_a, g.trans_b, threads, SgemmBackend::OnednnSgemm, {}};
  // The products go to a scratch C (beta 0: never read); A and B are the caller's.
  GemmArgs s = g;
  s.beta = 0.0;
  s.ldc = g.n;
  const size_t bytes = (static_cast<size_t>(g.m) * static_cast<size_t>(g.n) * sizeof(float) + 63) / 64 * 64;
  std::unique_ptr<void, FreeDeleter> scratch(std::aligned_alloc(64, bytes));
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, scratch != nullptr, "gemm_cpu: out of memory allocating ", bytes,
                 " bytes to time m ", g.m, ", n ", g.n, ", k ", g.k, " on each float32 GEMM library");
  float* c = static_cast<float*>(scratch.get());
  const auto* a = static_cast<const float*>(g.a);
  const auto* b = static_cast<const float*>(g.b);

  std::vector<SgemmBackend> candidates;
  for (SgemmBackend backend : kSgemmBackends) {
    if (eligible(backend, g, threads)) candidates.push_back(backend);
  }
  std::vector<double> best(candidates.size(), 1e300);  // seconds per call
  // Warm-up: JIT compilation, primitive creation, caches.
  for (SgemmBackend backend : candidates) detail::run_sgemm(backend, s, a, b, c);
  const auto start = Clock::now();
  for (int round = 0; round < 10 && (round < 3 || seconds_since(start) < 0.03); ++round) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      int64_t calls = 0;
      const auto t0 = Clock::now();
      double t = 0;
      do {
        detail::run_sgemm(candidates[i], s, a, b, c);
        ++calls;
        t = seconds_since(t0);
      } while (t < 2e-4);
      best[i] = std::min(best[i], t / static_cast<double>(calls));
    }
  }
  const double flops = detail::matrix_flops(g);
  size_t winner = 0;  // candidates[0] is onednn-sgemm
  for (size_t i = 0; i < candidates.size(); ++i) {
    choice.gflops.emplace_back(candidates[i], flops / best[i] * 1e-9);
    if (best[i] < best[winner]) winner = i;
  }
  if (winner != 0 && best[winner] * 1.10 > best[0]) winner = 0;  // not 10% faster than dnnl_sgemm: keep it
  choice.backend = candidates[winner];
  return choice;
}

}  // namespace

void set_sgemm_policy(SgemmPolicy policy) { policy_set.store(static_cast<int>(policy)); }

void clear_sgemm_policy() { policy_set.store(kNoPolicySet); }

SgemmPolicy current_sgemm_policy() {
  const int set = policy_set.load();
  return set == kNoPolicySet ? sgemm_policy_from_env() : static_cast<SgemmPolicy>(set);
}

std::vector<SgemmChoice> sgemm_choices() {
  ChoiceTable& table = choice_table();
  std::lock_guard lock(table.mutex);
  return table.made;
}

std::string describe(const SgemmChoice& c) {
  std::string text = dpe::detail::str_cat("m ", c.m, " n ", c.n, " k ", c.k, c.trans_a == Transpose::Yes ? " A^T" : "",
                                          c.trans_b == Transpose::Yes ? " B^T" : "", ", ", c.threads,
                                          c.threads == 1 ? " thread: " : " threads: ", sgemm_backend_name(c.backend),
                                          " (");
  for (size_t i = 0; i < c.gflops.size(); ++i) {
    text += dpe::detail::str_cat(i ? ", " : "", sgemm_backend_name(c.gflops[i].first), " ",
                                 static_cast<int64_t>(c.gflops[i].second + 0.5));
  }
  return text + " GFLOP/s)";
}

namespace detail {

SgemmBackend choose_sgemm(const GemmArgs& g) {
  const SgemmPolicy policy = current_sgemm_policy();
  if (policy == SgemmPolicy::Onednn) return onednn_rule(g);
  if (std::optional<SgemmBackend> forced = forced_backend(policy)) return *forced;
  const int threads = omp_get_max_threads();
  const ChoiceKey key{g.m, g.n, g.k, static_cast<int>(g.trans_a), static_cast<int>(g.trans_b), threads};
  ChoiceTable& table = choice_table();
  ChoiceEntry* entry;
  {
    std::lock_guard lock(table.mutex);
    std::unique_ptr<ChoiceEntry>& slot = table.entries[key];
    if (!slot) slot = std::make_unique<ChoiceEntry>();
    entry = slot.get();
  }
  // A measurement that throws (out of memory) leaves the flag unset: the next call measures again.
  std::call_once(entry->measured, [&] {
    SgemmChoice choice = measure(g, threads);
    entry->backend = choice.backend;
    std::lock_guard lock(table.mutex);
    table.made.push_back(std::move(choice));
  });
  // Chosen on another thread: this one may not get OpenBLAS's buffer (Note [OpenBLAS and address-space limits]).
  if (entry->backend == SgemmBackend::OpenBlas && !openblas_buffer_mappable()) return SgemmBackend::OnednnSgemm;
  return entry->backend;
}

void run_sgemm(SgemmBackend backend, const GemmArgs& g, const float* a, const float* b, float* c) {
  switch (backend) {
    case SgemmBackend::OnednnSgemm:
      return onednn_sgemm(g, a, b, c);
    case SgemmBackend::OnednnMatmul:
      return onednn_matmul(g, a, b, c);  // onednn_matmul_cpu.cc
    case SgemmBackend::OpenBlas:
      return openblas_sgemm(g, a, b, c);
  }
  DPE_INTERNAL_ASSERT(false, "unknown SgemmBackend ", static_cast<int>(backend));
}

}  // namespace detail
}  // namespace dpe::kernels
