#include "core/cpu_isa.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace dpe {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512_bf16";
  }
  DPE_INTERNAL_ASSERT(false, "unknown CpuIsa ", static_cast<int>(isa));
  return "";
}

CpuIsa native_cpu_isa() {
  static const CpuIsa native = [] {
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (!avx512) return CpuIsa::Avx2;
    return __builtin_cpu_supports("avx512bf16") ? CpuIsa::Avx512Bf16 : CpuIsa::Avx512;
  }();
  return native;
}

std::optional<CpuIsa> parse_cpu_isa_cap(std::string_view text) {
  if (text.empty() || text == "native") return std::nullopt;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16}) {
    if (text == cpu_isa_name(isa)) return isa;
  }
  DPE_CHECK(false, "DPE_MAX_CPU_ISA='", text, "': expected avx2, avx512, avx512_bf16 or native (unset: native)");
  return std::nullopt;  // not reached
}

std::optional<CpuIsa> cpu_isa_cap() {
  static const std::optional<CpuIsa> cap = [] {
    const char* env = std::getenv("DPE_MAX_CPU_ISA");
    return parse_cpu_isa_cap(env != nullptr ? env : "");
  }();
  return cap;
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = std::min(native_cpu_isa(), cpu_isa_cap().value_or(CpuIsa::Avx512Bf16));
  return isa;
}

const char* openblas_core_type(CpuIsa isa) { return isa == CpuIsa::Avx2 ? "Haswell" : "SkylakeX"; }

std::string cpu_isa_description() {
  const std::string isa(cpu_isa_name(cpu_isa()));
  if (cpu_isa() == native_cpu_isa()) return isa + " (the CPU's own)";
  return isa + " (DPE_MAX_CPU_ISA=" + std::string(cpu_isa_name(*cpu_isa_cap())) + " on an " +
         std::string(cpu_isa_name(native_cpu_isa())) + " CPU)";
}

}  // namespace dpe
