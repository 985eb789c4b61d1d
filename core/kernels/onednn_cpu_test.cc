// Out of memory inside oneDNN ends in a dpe::Error, never in glibc's abort (Note [Exceptions and oneDNN]
// in onednn_cpu.cc): "libgcc_s.so.1 must be installed for unwinding to work" once killed
// `dpe train --model cnn` under `ulimit -v 200000`.
//
// Each case runs in a forked child that lowers its address-space limit (RLIMIT_AS) to what it already uses
// plus some headroom, then makes its first oneDNN calls (convolution forward and backward, sgemm) on
// buffers allocated before the limit. A sweep of headrooms makes some children run out of memory inside
// oneDNN's lazy initialisation and some succeed. Without the fix, about a third of the children died of
// SIGABRT (the glibc abort); now none may: each reports a dpe::Error naming out of memory, or succeeds. A
// std::bad_alloc counts as that report too: so close to the limit, composing the dpe::Error's message can
// itself run out of memory, and then the exception is C++'s own for it (dpe's main reports it as out of
// memory, exit status 3); what matters is that an exception, not an abort, reaches the caller.
// What the test tolerates, and counts: SIGSEGV, oneDNN 2.6's own JIT writing through a code buffer it
// failed to allocate (Xbyak without exceptions), and exit status 1 after "libgomp: Out of memory ...", the
// OpenMP runtime ending the process itself; nothing outside them can turn those into errors. But not a
// SIGSEGV below kOneDnnBuildReserve of headroom: there the check before oneDNN generates its kernels must
// report out of memory first (measure 3 of the note; before it, 5-7 children of each sweep died so at 0-8 MiB).
// oneDNN runs single-threaded in the children, as on a dpe device worker with one thread: an exception on
// one of oneDNN's own OpenMP threads cannot be caught outside (the note says so).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/kernels/conv.h"
#include "core/kernels/matmul.h"
#include "core/kernels/onednn.h"

namespace dpe::kernels {
namespace {

enum ChildExit { kSucceeded = 10, kOutOfMemoryError = 11, kOtherException = 12, kOtherDpeError = 13, kNoLimit = 14 };
constexpr int kLibgompExit = 1;  // libgomp's gomp_fatal: exit(EXIT_FAILURE) after "libgomp: Out of memory ..."

// The process's current virtual size in bytes (/proc/self/statm, first field, in pages).
int64_t virtual_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  statm >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

// Runs in the child: first oneDNN calls under the limit. Never returns.
[[noreturn]] void child(int64_t headroom_bytes) {
  Conv2dShape s;
  s.n = 8, s.c_in = 16, s.h = 24, s.w = 24, s.c_out = 32, s.kh = 3, s.kw = 3, s.pad_h = 1, s.pad_w = 1;
  std::vector<float> x(s.n * s.c_in * s.h * s.w, 0.5f), w(s.c_out * s.c_in * s.kh * s.kw, 0.25f), b(s.c_out, 1.0f);
  std::vector<float> y(s.n * s.c_out * s.h_out() * s.w_out()), dx(x.size()), dw(w.size());
  GemmArgs g;
  g.m = 64, g.n = 64, g.k = 64, g.lda = 64, g.ldb = 64, g.ldc = 64;
  std::vector<float> ga(64 * 64, 1.0f), gb(64 * 64, 1.0f), gc(64 * 64);
  g.a = ga.data(), g.b = gb.data(), g.c = gc.data();

  // The calls run on a thread started before the limit, like a dpe device worker: its stack is mapped whole
  // when it starts, whereas the main thread's stack grows on demand and growth past RLIMIT_AS is a SIGSEGV
  // that would have nothing to do with oneDNN.
  std::mutex mutex;
  std::condition_variable cv;
  bool go = false;
  int code = kSucceeded;
  std::thread worker([&] {
    if (auto* set_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) {
      set_threads(1);  // libgomp comes with libdnnl; looked up at run time (the test does not link OpenMP)
    }
    {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return go; });
    }
    try {
      conv2d_forward_cpu(s, x.data(), w.data(), b.data(), y.data());
      conv2d_backward_data_cpu(s, y.data(), w.data(), dx.data());
      conv2d_backward_weight_cpu(s, x.data(), y.data(), dw.data());
      gemm_cpu(g);
    } catch (const Error& e) {
      code = std::string(e.what()).find("out of memory") != std::string::npos ? kOutOfMemoryError : kOtherDpeError;
      if (code == kOtherDpeError) std::fprintf(stderr, "headroom %lld: %s\n", static_cast<long long>(headroom_bytes), e.what());
    } catch (const std::bad_alloc&) {
      code = kOutOfMemoryError;
    } catch (...) {
      code = kOtherException;
    }
  });
  rlimit limit{static_cast<rlim_t>(virtual_bytes() + headroom_bytes), RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(kNoLimit);
  {
    std::lock_guard lock(mutex);
    go = true;
  }
  cv.notify_one();
  worker.join();
  _exit(code);
}

TEST(OneDnnCpu, OutOfMemoryInsideOneDnnIsAnErrorNotAnAbort) {
  int succeeded = 0, out_of_memory = 0, segfaults = 0, libgomp_exits = 0;
  const std::string log = ::testing::TempDir() + "/onednn_child_stderr.txt";
  // From no headroom to 40 MiB above the reserve: below it the check answers, above it oneDNN's own
  // allocations run out.
  const int64_t reserve_mib = static_cast<int64_t>(detail::kOneDnnBuildReserve >> 20), last_mib = reserve_mib + 40;
  for (int64_t headroom_mib = 0; headroom_mib <= last_mib; ++headroom_mib) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (std::freopen(log.c_str(), "w", stderr) == nullptr) _exit(kNoLimit);
      child(headroom_mib << 20);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) {
      EXPECT_GE(headroom_mib, reserve_mib) << "headroom " << headroom_mib << " MiB: the child died of SIGSEGV where "
                                           << "the check before oneDNN's kernels should have reported out of memory";
      ++segfaults;  // oneDNN's JIT (see the file comment)
      continue;
    }
    std::ifstream in(log);
    const std::string child_stderr((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (WIFEXITED(status) && WEXITSTATUS(status) == kLibgompExit &&
        child_stderr.find("libgomp: Out of memory") != std::string::npos) {
      ++libgomp_exits;  // the OpenMP runtime's own exit (see the file comment)
      continue;
    }
    ASSERT_TRUE(WIFEXITED(status)) << "headroom " << headroom_mib << " MiB: the child was killed by signal "
                                   << WTERMSIG(status) << " instead of reporting (6: the glibc unwinding abort); "
                                   << "its stderr: " << child_stderr;
    const int code = WEXITSTATUS(status);
    EXPECT_TRUE(code == kSucceeded || code == kOutOfMemoryError || code == kNoLimit)
        << "headroom " << headroom_mib << " MiB: exit code " << code
        << " (12: an exception other than dpe::Error; 13: a dpe::Error not about memory); its stderr: "
        << child_stderr;
    succeeded += code == kSucceeded;
    out_of_memory += code == kOutOfMemoryError;
  }
  std::printf("%lld children: %d succeeded, %d reported out of memory, %d died in oneDNN's JIT (SIGSEGV), "
              "%d were ended by libgomp\n", static_cast<long long>(last_mib + 1), succeeded, out_of_memory, segfaults,
              libgomp_exits);
  // The sweep must cover both outcomes, or it tested nothing.
  EXPECT_GT(succeeded, 0);
  EXPECT_GT(out_of_memory, 0);
}

// prepare_cpu_gemm generates dnnl_sgemm's kernels (DeviceWorkerPool calls it before its workers start, so
// that no worker's first product does it while another allocates): in a fresh process, the address space
// grows at prepare_cpu_gemm and no longer at the first product, and the caller's OpenMP thread count is kept.
TEST(OneDnnCpu, PrepareCpuGemmGeneratesTheKernelsBeforeTheFirstProduct) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    auto max_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (set_threads == nullptr || max_threads == nullptr) _exit(20);
    set_threads(3);
    const int64_t before = virtual_bytes();
    prepare_cpu_gemm();
    const int64_t prepared = virtual_bytes();
    if (max_threads() != 3) _exit(21);
    GemmArgs g;
    g.m = 64, g.n = 64, g.k = 64, g.lda = 64, g.ldb = 64, g.ldc = 64;
    std::vector<float> a(64 * 64, 1.0f), b(64 * 64, 1.0f), c(64 * 64);
    g.a = a.data(), g.b = b.data(), g.c = c.data();
    set_threads(1);
    const int64_t vectors = virtual_bytes();
    gemm_cpu(g);
    const int64_t multiplied = virtual_bytes();
    std::fprintf(stderr, "prepare_cpu_gemm: +%lld KiB; then the first product: +%lld KiB\n",
                 static_cast<long long>((prepared - before) >> 10),
                 static_cast<long long>((multiplied - vectors) >> 10));
    if (prepared - before < (int64_t{2} << 20)) _exit(22);   // dnnl_sgemm's kernels: ~6 MB
    if (multiplied - vectors >= (int64_t{1} << 20)) _exit(23);
    _exit(c[0] == 64.0f ? 0 : 24);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "20: no OpenMP; 21: the caller's thread count changed; 22: prepare_cpu_gemm "
                                       "generated no kernels; 23: the first product still did; 24: wrong product";
}

}  // namespace
}  // namespace dpe::kernels
