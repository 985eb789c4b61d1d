#include "tools/dpe/environment.h"

#include <cstdlib>
#include <string>

#include "core/cpu_isa.h"
#include "core/device.h"
#include "core/error.h"
#include "core/kernels/sgemm_choice.h"
#include "engine/worker_pool.h"
#include "tools/dpe/cli_util.h"

namespace dpe::tool {

namespace {

constexpr int64_t kMaxThreads = 1024;

// Thread counts as libgomp and OpenBLAS take them: a positive integer, or (`list`) a comma list of them.
void check_thread_count(const char* name, bool list) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return;
  const std::string text = env;
  const std::string what = dpe::detail::str_cat(name, "='", text, "': expected ", list ? "integers" : "an integer",
                                           " in [1, ", kMaxThreads, "]", list ? ", comma-separated" : "");
  size_t begin = 0;
  while (true) {
    const size_t comma = list ? text.find(',', begin) : std::string::npos;
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    try {
      parse_int(name, item, 1, kMaxThreads);
    } catch (const Error&) {
      DPE_CHECK(false, what);
    }
    if (comma == std::string::npos) return;
    begin = comma + 1;
  }
}

}  // namespace

void check_environment() {
  num_cpu_devices();
  if (const char* cores = std::getenv("DPE_CPU_DEVICE_CORES"); cores != nullptr && *cores != '\0') {
    parse_cpu_device_cores(cores);
  }
  kernels::sgemm_policy_from_env();
  cpu_isa();
  check_thread_count("OMP_NUM_THREADS", /*list=*/true);
  check_thread_count("OPENBLAS_NUM_THREADS", /*list=*/false);
}

}  // namespace dpe::tool
