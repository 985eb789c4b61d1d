// Which library runs a float32 GEMM on CPU (Note [float32 GEMM choice] in core/kernels/sgemm_cpu.cc): one
// library for every shape (by default oneDNN's dnnl_sgemm, so that runs repeat bit for bit), or, with the
// policy "auto", each (m, n, k, transposes, threads) measured once on every candidate and the fastest kept.
// DPE_CPU_SGEMM or set_sgemm_policy() picks the policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/kernels/matmul.h"

namespace dpe::kernels {

enum class SgemmBackend : uint8_t {
  OnednnSgemm,   // "onednn-sgemm": oneDNN's dnnl_sgemm (JIT for the CPU it finds); dpe's default before
  OnednnMatmul,  // "onednn-matmul": oneDNN's matmul primitive (brgemm kernels), one built per shape
  OpenBlas,      // "openblas": OpenBLAS's cblas_sgemm, with the kernel OpenBLAS chose when it was loaded
};

inline constexpr SgemmBackend kSgemmBackends[] = {SgemmBackend::OnednnSgemm, SgemmBackend::OnednnMatmul,
                                                  SgemmBackend::OpenBlas};

// "onednn-sgemm", "onednn-matmul" or "openblas": the words DPE_CPU_SGEMM accepts.
std::string_view sgemm_backend_name(SgemmBackend backend);

// A policy: one backend for every shape, or nullopt for "auto" (the measured choice per shape).
using SgemmPolicy = std::optional<SgemmBackend>;

// Without DPE_CPU_SGEMM or set_sgemm_policy(): dnnl_sgemm, what dpe always ran. Not "auto", because a
// choice made by timing can differ between two runs (or two processes of one run), the libraries round
// differently, and a resumed run must repeat the uninterrupted one byte for byte (docs/RELIABILITY.md).
inline constexpr SgemmPolicy kDefaultSgemmPolicy = SgemmBackend::OnednnSgemm;

// The value of DPE_CPU_SGEMM: "auto" or a backend's name. Anything else throws a dpe::Error naming `text` and
// the accepted words.
SgemmPolicy parse_sgemm_policy(std::string_view text);

// DPE_CPU_SGEMM, read on every call (unset or empty: kDefaultSgemmPolicy). Throws as parse_sgemm_policy does.
SgemmPolicy sgemm_policy_from_env();

// For code that must choose from inside the process (tests, an application): `policy` from now on, whatever
// DPE_CPU_SGEMM says, until clear_sgemm_policy() goes back to the variable. Thread-safe; a GEMM already
// running finishes with the library it started with.
void set_sgemm_policy(SgemmPolicy policy);
void clear_sgemm_policy();

// The policy gemm_cpu follows now: set_sgemm_policy's, else DPE_CPU_SGEMM's (throws as above).
SgemmPolicy current_sgemm_policy();

// One measured choice: the shape, the caller's thread share (omp_get_max_threads()), what won, and what each
// eligible candidate reached (GFLOP/s, best of the measured calls).
struct SgemmChoice {
  int64_t m = 0, n = 0, k = 0;
  Transpose trans_a = Transpose::No, trans_b = Transpose::No;
  int threads = 1;
  SgemmBackend backend = SgemmBackend::OnednnSgemm;
  std::vector<std::pair<SgemmBackend, double>> gflops;
};

// Every choice measured in this process so far, in the order made (only "auto" measures).
std::vector<SgemmChoice> sgemm_choices();

// "m 256 n 512 k 784 B^T, 1 thread: onednn-sgemm (onednn-sgemm 238, onednn-matmul 236, openblas 117 GFLOP/s)"
std::string describe(const SgemmChoice& choice);

}  // namespace dpe::kernels

namespace dpe::kernels::detail {

// For gemm_cpu (matmul_cpu.cc) only. The backend for float32 `g` (m, n, k > 0, alpha != 0; arguments already
// checked) under current_sgemm_policy(): the policy's backend, or under "auto" the measured choice, measuring
// on g.a and g.b into a scratch C the first time this shape and thread share are seen.
SgemmBackend choose_sgemm(const GemmArgs& g);

// One product of `g`'s shape and scalars on a, b, c with `backend`.
void run_sgemm(SgemmBackend backend, const GemmArgs& g, const float* a, const float* b, float* c);

}  // namespace dpe::kernels::detail
