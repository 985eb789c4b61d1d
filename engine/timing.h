// Host wall-clock timing of the engine's step phases (StepReport). Internal to engine/.
#pragma once

#include <chrono>

namespace dpe::detail {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace dpe::detail
