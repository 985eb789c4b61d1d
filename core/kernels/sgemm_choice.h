// Which library runs a float32 GEMM on CPU (Note [float32 GEMM choice] in core/kernels/sgemm_cpu.cc): by
// default "onednn", a fixed rule over oneDNN's two interfaces by operand layout and size, so that runs repeat
// bit for bit; or one library for every shape; or, with the policy "auto", each (m, n, k, transposes,
// threads) measured once on every candidate and the fastest kept. DPE_CPU_SGEMM or set_sgemm_policy() picks
// the policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/kernels/matmul.h"

namespace dpe::kernels {

enum class SgemmBackend : uint8_t {
  OnednnSgemm,   // "onednn-sgemm": oneDNN's dnnl_sgemm (JIT for the CPU it finds)
  OnednnMatmul,  // "onednn-matmul": oneDNN's matmul primitive (brgemm kernels), one built per shape
  OpenBlas,      // "openblas": OpenBLAS's cblas_sgemm, with the kernel OpenBLAS chose when it was loaded
};

inline constexpr SgemmBackend kSgemmBackends[] = {SgemmBackend::OnednnSgemm, SgemmBackend::OnednnMatmul,
                                                  SgemmBackend::OpenBlas};

// "onednn-sgemm", "onednn-matmul" or "openblas" (also the names of the policies forcing them).
std::string_view sgemm_backend_name(SgemmBackend backend);

// How gemm_cpu picks the library of a float32 product; the names are the words DPE_CPU_SGEMM accepts.
enum class SgemmPolicy : uint8_t {
  Onednn,        // "onednn": onednn_rule(), a fixed choice by operand layout and size (the default)
  Auto,          // "auto": measured once per (m, n, k, transposes, threads), the fastest kept
  OnednnSgemm,   // "onednn-sgemm", "onednn-matmul", "openblas": that library for every shape
  OnednnMatmul,
  OpenBlas,
};

inline constexpr SgemmPolicy kSgemmPolicies[] = {SgemmPolicy::Onednn, SgemmPolicy::Auto, SgemmPolicy::OnednnSgemm,
                                                 SgemmPolicy::OnednnMatmul, SgemmPolicy::OpenBlas};

std::string_view sgemm_policy_name(SgemmPolicy policy);

// The library `policy` runs every shape on, or nullopt for "onednn" and "auto" (they choose per shape).
std::optional<SgemmBackend> forced_backend(SgemmPolicy policy);
// The policy that runs every shape on `backend`.
SgemmPolicy forcing(SgemmBackend backend);

// Without DPE_CPU_SGEMM or set_sgemm_policy(). Not "auto", because a choice made by timing can differ between
// two runs (or two processes of one run), the libraries round differently, and a resumed run must repeat the
// uninterrupted one byte for byte (docs/RELIABILITY.md); "onednn" depends on the shape alone.
inline constexpr SgemmPolicy kDefaultSgemmPolicy = SgemmPolicy::Onednn;

// The "onednn" policy's library for one product of g's shape (each matrix of a batch): oneDNN's matmul
// primitive for A @ B^T (A not transposed) of at least kMatmulPrimitiveFlops, nn::Linear's forward; dnnl_sgemm
// for everything else.
inline constexpr double kMatmulPrimitiveFlops = 2e7;
SgemmBackend onednn_rule(const GemmArgs& g);

// The value of DPE_CPU_SGEMM: a policy's name. Anything else throws a dpe::Error naming `text` and the accepted
// words.
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
// checked) under current_sgemm_policy(): the forced backend, onednn_rule(g), or under "auto" the measured
// choice, measuring on g.a and g.b into a scratch C the first time this shape and thread share are seen.
SgemmBackend choose_sgemm(const GemmArgs& g);

// One product of `g`'s shape and scalars on a, b, c with `backend`.
void run_sgemm(SgemmBackend backend, const GemmArgs& g, const float* a, const float* b, float* c);

}  // namespace dpe::kernels::detail
