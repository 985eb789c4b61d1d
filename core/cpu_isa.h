// The x86-64 instruction set dpe's CPU paths use, and the one switch that caps it.
//
// Note [The CPU instruction-set cap]
// dpe is compiled for x86-64-v3 (AVX2 with FMA) and takes wider paths where the CPU has them: its own
// AVX-512 kernels (the fused first convolution), oneDNN's AVX-512 and bfloat16 JIT kernels, and CPU autocast,
// which computes in bfloat16 only where the CPU multiplies bfloat16 natively (otherwise oneDNN emulates it,
// slower than float32). DPE_MAX_CPU_ISA caps all of them at once, so that one machine runs every path a
// slower machine would take (tools/test.sh runs the instruction-set-sensitive tests under each cap):
//
//   DPE_MAX_CPU_ISA   dpe's kernels   oneDNN's ISA (set_max_cpu_isa)   CPU autocast
//   avx2              AVX2            avx2                             float32 (warns)
//   avx512            AVX-512         avx512_core                      float32 (warns)
//   avx512_bf16       AVX-512         avx512_core_bf16 (no AMX)        bfloat16
//   native, unset     the CPU's       the CPU's (or ONEDNN_MAX_CPU_ISA) bfloat16 where the CPU has it
//
// A cap never raises: on an AVX2-only CPU every cap gives AVX2. The cap is read once per process, at the
// first call of cpu_isa(); oneDNN's is applied before dpe's first oneDNN call (kernels::onednn_cpu_engine and
// friends), and must be: oneDNN fixes its ISA at its own first use. OpenBLAS (float64 GEMMs, and float32 under
// DPE_CPU_SGEMM=openblas) picks its kernels when it is loaded, from OPENBLAS_CORETYPE: a cap cannot reach it
// from inside the process, so the dpe tool sets it (openblas_core_type) and starts itself again, and an
// embedding application sets it itself (so do the capped test runs: tools/build/isa_capped_test.sh).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dpe {

// Ordered: each extends the one before.
enum class CpuIsa {
  Avx2,        // x86-64-v3: AVX2 + FMA, dpe's baseline
  Avx512,      // AVX-512 F, BW, DQ and VL (oneDNN's avx512_core)
  Avx512Bf16,  // and AVX512_BF16: bfloat16 products in hardware
};

// "avx2", "avx512", "avx512_bf16": the names DPE_MAX_CPU_ISA takes.
std::string_view cpu_isa_name(CpuIsa isa);

// What this CPU has (cpuid). Not capped.
CpuIsa native_cpu_isa();

// A DPE_MAX_CPU_ISA value: avx2, avx512 or avx512_bf16; native or empty is no cap (nullopt). Throws on
// anything else, naming the value and the choices.
std::optional<CpuIsa> parse_cpu_isa_cap(std::string_view text);

// The cap DPE_MAX_CPU_ISA sets (nullopt: none). Read and checked once per process; throws on a bad value
// (every call, until the environment is fixed).
std::optional<CpuIsa> cpu_isa_cap();

// What dpe's CPU paths use: native_cpu_isa() lowered to cpu_isa_cap(). Thread-safe; constant for the process.
CpuIsa cpu_isa();

// OpenBLAS's core type (OPENBLAS_CORETYPE) for the cap `isa`: "Haswell" (AVX2) or "SkylakeX" (AVX-512, whose
// kernels use no bfloat16 instructions). The dpe tool sets it under DPE_MAX_CPU_ISA when it is unset.
const char* openblas_core_type(CpuIsa isa);

// cpu_isa() for messages: "avx2 (DPE_MAX_CPU_ISA=avx2 on an avx512_bf16 CPU)", or "avx512 (the CPU's own)".
std::string cpu_isa_description();

}  // namespace dpe
