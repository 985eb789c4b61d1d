// A test seam of `dpe train`: the faults the tool's shell tests inject (dpe_train_test.sh, device failures and
// lost devices end to end), through options hidden from --help:
//   --inject-failure DEVICE@STEP   the loss on DEVICE throws in that step
//   --inject-hang DEVICE@STEP      the loss on DEVICE never returns in that step (a kernel stuck for good: the
//                                  engine declares the device lost)
// STEP counts the run's optimizer steps from 0 (a resumed run counts its own).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/data_parallel.h"

namespace dpe::tool {

struct InjectedFaults {
  std::string failure, hang;  // DEVICE@STEP, or empty
};

void add_fault_injection_options(CLI::App& cmd, InjectedFaults& faults);

// `loss` with `faults` injected; `step_in_run` (the caller's counter) must outlive the returned function.
// Throws naming the option when a value is not DEVICE@STEP.
LossFn with_injected_faults(LossFn loss, const InjectedFaults& faults, const int64_t& step_in_run);

}  // namespace dpe::tool
