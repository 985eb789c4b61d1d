// See core/kernels/onednn.h.
//
// Note [Exceptions and oneDNN]
// oneDNN is C++ inside, also behind its C API: when it runs out of memory in code that reports no status
// (lazy one-time initialisation during dnnl_primitive_execute, JIT code buffers), a std::bad_alloc unwinds
// out through its frames. Some of those frames are glibc's C code with cleanups: pthread_once, which
// std::call_once (and so oneDNN's lazy initialisation) runs on. glibc unwinds its own frames with a
// personality routine that dlopens libgcc_s.so.1 the first time it is needed; under memory pressure that
// dlopen fails and glibc aborts the process with "libgcc_s.so.1 must be installed for unwinding to work"
// (reproduced: `ulimit -v 200000; dpe train --model cnn --limit 512`, backtrace __gcc_personality_v0 <-
// __pthread_once_slow <- libdnnl <- dnnl_primitive_execute <- conv2d_forward_cpu). Two measures:
//  1. At start-up, while memory is plentiful, one exception is thrown through std::call_once's pthread_once
//     frame: glibc then loads libgcc_s for its unwinder and keeps it, so a later exception through such a
//     frame unwinds instead of aborting.
//  2. Every call into oneDNN sits in a try block whose catch turns what escapes into a dpe::Error
//     (rethrow_onednn_failure), and the large buffers oneDNN needs per call (convolution scratchpads) are
//     allocated by dpe, which checks the allocation and names it, rather than inside oneDNN.
//  3. Before oneDNN generates kernels (a primitive built in conv_cpu.cc or onednn_matmul_cpu.cc, the first
//     dnnl_sgemm call of each variant in sgemm_cpu.cc), check_space_for_onednn_build reserves and releases
//     kOneDnnBuildReserve of address space: closer to the limit than that, the call is an out-of-memory
//     dpe::Error instead. Generating kernels is where oneDNN allocates outside dpe's control (JIT code
//     buffers, tables) and fails where no catch reaches: a std::bad_alloc while creating a reorder primitive
//     ended in std::terminate in a noexcept frame ("terminate called without an active exception", status
//     134: 2 of 4,212 runs of tools/reliability/ulimit_stress.sh, 2026-11-26), and a JIT code buffer it failed
//     to allocate is the SIGSEGV below (`dpe train --model cnn` under `ulimit -v 243930`, 100 runs: 95 SIGSEGV,
//     2 std::terminate and 3 out-of-memory errors before, 100 errors after). Another thread can take the
//     space between the check and the build, so it makes those failures unlikely, not impossible (the largest
//     such taker, glibc making a thread's malloc arena, the tool rules out under an address-space limit: Note
//     [One malloc arena under an address-space limit] in tools/dpe/malloc_arenas.h). Most
//     SIGSEGVs left in the soak (19 in 4,836 runs, against 166 in 4,212 before) were dnnl_sgemm's one-time
//     JIT initialisation (~6 MB of address space, all float32 kernels at once, inside std::call_once) on one
//     device's worker while the other device's forward allocated its activations: DeviceWorkerPool now has
//     those kernels generated before it starts its CPU workers (prepare_cpu_gemm, matmul.h).
// What cannot be made safe from outside (seen with core/kernels/onednn_cpu_test.cc's address-space sweep):
//  - oneDNN 2.6's JIT writes through a code buffer it failed to allocate (Xbyak without exceptions): SIGSEGV;
//  - libgomp, oneDNN's OpenMP runtime, exits the process with status 1 ("libgomp: Out of memory allocating
//    ...", "libgomp: Thread creation failed: ...") when its own allocations or threads fail;
//  - an exception thrown on one of oneDNN's OpenMP worker threads ends in std::terminate inside the OpenMP
//    runtime (an exception may not leave a parallel region).
#include "core/kernels/onednn.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>

#include <sys/mman.h>

#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>

#include "core/cpu_isa.h"
#include "core/error.h"

namespace dpe::kernels::detail {
namespace {

// Measure 1 of the note: runs during static initialisation of any program that links the CPU kernels.
const bool kUnwinderPrimed = [] {
  std::once_flag flag;
  try {
    std::call_once(flag, [] { throw 0; });
  } catch (int) {
  }
  return true;
}();

dnnl::cpu_isa onednn_isa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return dnnl::cpu_isa::avx2;
    case CpuIsa::Avx512: return dnnl::cpu_isa::avx512_core;
    case CpuIsa::Avx512Bf16: return dnnl::cpu_isa::avx512_core_bf16;
  }
  DPE_INTERNAL_ASSERT(false, "unknown CpuIsa ", static_cast<int>(isa));
  return dnnl::cpu_isa::all;
}

}  // namespace

void apply_cpu_isa_cap_to_onednn() {
  static const bool applied = [] {
    const std::optional<CpuIsa> cap = cpu_isa_cap();
    if (!cap.has_value()) return true;
    const dnnl::cpu_isa isa = onednn_isa(*cap);
    if (dnnl::set_max_cpu_isa(isa) == dnnl::status::success) return true;
    // oneDNN fixed its ISA at a first use before dpe's (an embedding application's own oneDNN call): that is
    // acceptable only at or below the cap. ISA values are bit masks, each containing the ones it extends.
    const dnnl::cpu_isa effective = dnnl::get_effective_cpu_isa();
    std::string_view name = dnnl_cpu_isa2str(static_cast<dnnl_cpu_isa_t>(effective));  // "cpu_isa_avx2"
    if (name.starts_with("cpu_isa_")) name.remove_prefix(8);
    DPE_CHECK((static_cast<unsigned>(effective) & ~static_cast<unsigned>(isa)) == 0, "DPE_MAX_CPU_ISA=",
              cpu_isa_name(*cap), " cannot cap oneDNN: it was used before dpe and fixed its instruction set at ",
              name, " (set ONEDNN_MAX_CPU_ISA too, or let dpe make the process's first oneDNN call)");
    return true;
  }();
  (void)applied;
}

dnnl::engine& onednn_cpu_engine() {
  static dnnl::engine* engine = [] {
    apply_cpu_isa_cap_to_onednn();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed
  }();
  return *engine;
}

void check_space_for_onednn_build(const char* what, const std::string& context) {
  apply_cpu_isa_cap_to_onednn();
  void* p = mmap(nullptr, kOneDnnBuildReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  DPE_CHECK_WITH(ErrorKind::OutOfMemory, p != MAP_FAILED, what, ": out of memory: building oneDNN's kernels ", context,
                 " needs address space, and ", kOneDnnBuildReserve >> 20,
                 " MiB of it cannot be reserved (Note [Exceptions and oneDNN])");
  munmap(p, kOneDnnBuildReserve);
}

void rethrow_onednn_failure(const char* what, const std::string& context) {
  (void)kUnwinderPrimed;
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const dnnl::error& e) {
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, e.status != dnnl_out_of_memory, what, ": out of memory inside oneDNN (",
                   e.what(), ") ", context);
    DPE_CHECK(false, what, ": oneDNN failed: ", e.what(), " (status ", dnnl_status2str(e.status), ") ", context);
  } catch (const std::bad_alloc& e) {
    DPE_CHECK_WITH(ErrorKind::OutOfMemory, false, what, ": out of memory inside oneDNN (", e.what(), ") ", context);
  } catch (const std::exception& e) {
    DPE_CHECK(false, what, ": oneDNN failed with an exception: ", e.what(), " ", context);
  } catch (...) {
    DPE_CHECK(false, what, ": oneDNN failed with an exception that is not a std::exception ", context);
  }
}

}  // namespace dpe::kernels::detail
