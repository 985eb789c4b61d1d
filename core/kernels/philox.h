// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), host and device.
// One call maps (key = seed, counter = offset + i) to four 32-bit words; dpe uses one call per element,
// so element i never depends on how the fill is split between threads.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dpe::kernels {

struct PhiloxOutput {
  uint32_t v[4];
};

DPE_HOST_DEVICE uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

DPE_HOST_DEVICE PhiloxOutput philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0 = mulhi32(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = mulhi32(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 53 random bits, from words 0 and 1.
DPE_HOST_DEVICE double philox_uniform(const PhiloxOutput& r) {
  uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11);
  return static_cast<double>(bits & ((uint64_t(1) << 53) - 1)) * 0x1.0p-53;
}

// Standard normal by Box-Muller from words 2 and 3 (u in (0, 1], so log(u) is finite). Computed in
// double on both backends so that float results agree between CPU and CUDA.
DPE_HOST_DEVICE double philox_normal(const PhiloxOutput& r) {
  double u = (static_cast<double>(r.v[2]) + 1.0) * 0x1.0p-32;
  double theta = static_cast<double>(r.v[3]) * 0x1.0p-32 * 6.283185307179586476925;
  return sqrt(-2.0 * log(u)) * cos(theta);
}

}  // namespace dpe::kernels
