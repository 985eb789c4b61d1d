// dpe: the command-line tool. `dpe --help` lists the subcommands, `dpe <command> --help` their options.
//
//   dpe devices       devices, memory, peer access; checks a --device-ids / --output-device configuration
//   dpe collectives   nccl-tests-style bandwidth table of the process group's collectives
//   dpe train         train mlp / cnn / tiny-llama in single, DP or DDP mode
//   dpe bench         the same model, data and batch in single, DP and DDP mode, side by side
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "tools/dpe/commands.h"

int main(int argc, char** argv) {
  // oneDNN's OpenMP threads spin after every GEMM by default, taking the cores that the next kernels (oneTBB)
  // need whenever a device has more than one thread: one CPU device on 2 cores ran the MLP 5x slower. libgomp
  // reads the policy once, when it is loaded, so the tool sets it and starts itself again.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  }
  CLI::App app{"dpe: a data-parallel training engine (DP and DDP modes on CPU and CUDA devices)", "dpe"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default
  dpe::tool::add_devices_command(app);
  dpe::tool::add_collectives_command(app);
  dpe::tool::add_train_command(app);
  dpe::tool::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dpe::Error& e) {
    const CLI::App* command = app.get_subcommands().empty() ? &app : app.get_subcommands()[0];
    std::fprintf(stderr, "dpe %s: %s\n", command->get_name().c_str(), e.what());
    return 2;
  }
  return 0;
}
