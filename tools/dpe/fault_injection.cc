#include "tools/dpe/fault_injection.h"

#include <chrono>
#include <thread>
#include <utility>

#include "core/error.h"
#include "tools/dpe/cli_util.h"

namespace dpe::tool {

namespace {

std::pair<Device, int64_t> device_and_step(const char* option, const std::string& value) {
  const size_t at = value.find('@');
  DPE_CHECK(at != std::string::npos, option, " ", value, ": expected DEVICE@STEP");
  return {Device::parse(value.substr(0, at)), parse_int(option, value.substr(at + 1), 0, int64_t{1} << 40)};
}

}  // namespace

void add_fault_injection_options(CLI::App& cmd, InjectedFaults& faults) {
  cmd.add_option("--inject-failure", faults.failure, "")->group("");
  cmd.add_option("--inject-hang", faults.hang, "")->group("");
}

LossFn with_injected_faults(LossFn loss, const InjectedFaults& faults, const int64_t& step_in_run) {
  if (!faults.failure.empty()) {
    const auto [device, step] = device_and_step("--inject-failure", faults.failure);
    loss = [inner = loss, device, step, &step_in_run](const Tensor& out, const Tensor& target) {
      DPE_CHECK(!(out.device() == device && step_in_run == step), "failure injected by --inject-failure on ", device);
      return inner(out, target);
    };
  }
  if (!faults.hang.empty()) {
    const auto [device, step] = device_and_step("--inject-hang", faults.hang);
    loss = [inner = loss, device, step, &step_in_run](const Tensor& out, const Tensor& target) {
      while (out.device() == device && step_in_run == step) std::this_thread::sleep_for(std::chrono::hours(1));
      return inner(out, target);
    };
  }
  return loss;
}

}  // namespace dpe::tool
