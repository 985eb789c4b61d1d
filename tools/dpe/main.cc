// dpe: the command-line tool. `dpe --help` lists the subcommands, `dpe <command> --help` their options.
//
//   dpe devices       devices, memory, peer access; checks a --device-ids / --output-device configuration
//   dpe collectives   nccl-tests-style bandwidth table of the process group's collectives
//   dpe tokenize      a SentencePiece BPE tokenizer and llm.c token shards from text files
//   dpe train         train mlp / cnn / tiny-llama by epochs, or a llama preset on token shards by steps, in
//                     single, DP or DDP mode
//   dpe bench         the same model, data and batch in single, DP and DDP mode, side by side
//
// Exit status: 0 success; 2 a dpe::Error (a bad argument, file or configuration; the message names it);
// 3 out of memory (a dpe::Error of kind OutOfMemory, a std::bad_alloc, a thread that could not be created);
// 4 any other exception (a bug: please report it); CLI11's own codes (100 and up) for command-line syntax
// errors.
// Every error is one line on stderr, "dpe <command>: <message>"; nothing ends in abort().
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string_view>
#include <system_error>

#include "collectives/process_group.h"
#include "core/cpu_isa.h"
#include "core/error.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/environment.h"
#include "tools/dpe/malloc_arenas.h"

int main(int argc, char** argv) {
  // oneDNN's OpenMP threads spin after every GEMM by default, taking the cores that the next kernels (oneTBB)
  // need whenever a device has more than one thread: one CPU device on 2 cores ran the MLP 5x slower.
  // OpenBLAS (float64 GEMM only, which the tool never runs) starts a pool thread per core when it is loaded;
  // under memory pressure those threads retry mmap forever and the exit hangs joining them (seen with
  // `ulimit -v 150000; dpe train`), so the tool keeps it single-threaded. Both libraries read their setting
  // once, when they are loaded, so the tool sets what is unset and starts itself again.
  bool restart = false;
  for (const char* name : {"OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS"}) {
    if (std::getenv(name) == nullptr) {
      setenv(name, std::string_view(name) == "OMP_WAIT_POLICY" ? "PASSIVE" : "1", 1);
      restart = true;
    }
  }
  // DPE_MAX_CPU_ISA caps OpenBLAS through its own variable, which it reads when loaded too (Note [The CPU
  // instruction-set cap], core/cpu_isa.h). A bad value is reported below, as the command's error.
  if (const char* cap = std::getenv("DPE_MAX_CPU_ISA"); cap != nullptr && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    try {
      if (std::optional<dpe::CpuIsa> isa = dpe::parse_cpu_isa_cap(cap); isa && *isa < dpe::native_cpu_isa()) {
        setenv("OPENBLAS_CORETYPE", dpe::openblas_core_type(*isa), 1);
        restart = true;
      }
    } catch (const dpe::Error&) {
    }
  }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
  dpe::tool::one_malloc_arena_under_address_limit();  // before any thread starts (tools/dpe/malloc_arenas.h)
  // Built inside the try below: building the options allocates, and running out of memory there is reported
  // like anywhere else.
  std::optional<CLI::App> app;
  // "dpe <command>: <message>" on stderr, then the exit status of the kind of failure. After a std::bad_alloc
  // the report itself may find no memory: then it says "dpe: <message>" (get_subcommands builds a vector).
  auto report = [&app](const char* prefix, const char* message, const char* suffix, int status) noexcept {
    const CLI::App* command = nullptr;
    try {
      if (app && !app->get_subcommands().empty()) command = app->get_subcommands()[0];
    } catch (...) {
    }
    std::fprintf(stderr, "dpe%s%s: %s%s%s\n", command == nullptr ? "" : " ",
                 command == nullptr ? "" : command->get_name().c_str(), prefix, message, suffix);
    return status;
  };
  // After a failure the process ends with _Exit once stderr and stdout are flushed: the libraries' exit-time
  // teardown (thread pools joined by OpenBLAS, libgomp, oneTBB) is skipped, because after running out of
  // memory it may wait forever on a thread that never started properly. Every dpe object of the command was
  // already destroyed while the exception unwound.
  int status = 0;
  try {
    app.emplace("dpe: a data-parallel training engine (DP and DDP modes on CPU and CUDA devices)", "dpe");
    app->require_subcommand(1);
    app->option_defaults()->always_capture_default();  // --help shows every default
    dpe::tool::add_devices_command(*app);
    dpe::tool::add_collectives_command(*app);
    dpe::tool::add_train_command(*app);
    dpe::tool::add_bench_command(*app);
    dpe::tool::add_tokenize_command(*app);
    app->footer("Exit status: 0 success, 2 error (bad argument, file or configuration), 3 out of memory, "
                "4 unexpected internal error.");
    // CLI11 answers an unknown command word with "A subcommand is required", which does not name it.
    if (argc > 1 && argv[1][0] != '-') {
      bool known = true;
      try {
        app->get_subcommand(argv[1]);
      } catch (const CLI::OptionNotFound&) {
        known = false;
      }
      if (!known) {
        std::fprintf(stderr, "dpe: unknown command '%s'; expected devices, collectives, tokenize, train or bench (dpe --help)\n",
                     argv[1]);
        return static_cast<int>(CLI::ExitCodes::ExtrasError);  // what an unknown option gives
      }
    }
    // The environment's settings, checked once the command line is (--help needs none), before the command runs.
    app->parse_complete_callback([] { dpe::tool::check_environment(); });
    app->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app->exit(e);
  } catch (const dpe::Error& e) {
    status = report("", e.what(), "", e.kind() == dpe::ErrorKind::OutOfMemory ? 3 : 2);
  } catch (const std::bad_alloc& e) {
    status = report("out of memory (", e.what(),
                    ") in an allocation outside dpe's allocators, which name what they allocate", 3);
  } catch (const std::system_error& e) {
    // Creating a thread (std::thread, a library's pool) fails with EAGAIN when memory or the thread limit is
    // exhausted: a resource error, not a bug.
    const bool resources = e.code() == std::errc::resource_unavailable_try_again ||
                           e.code() == std::errc::not_enough_memory;
    status = resources ? report("out of memory or threads: ", e.what(), " (creating a thread or a buffer failed)", 3)
                       : report("unexpected error: ", e.what(), " (a bug in dpe: please report it)", 4);
  } catch (const std::exception& e) {
    status = report("unexpected error: ", e.what(), " (a bug in dpe: please report it)", 4);
  } catch (...) {
    status = report("unexpected error: ", "an exception that is not a std::exception",
                    " (a bug in dpe: please report it)", 4);
  }
  // What a command printed is its result: standard output that could not be written (a full disk, /dev/full)
  // is a failure, not a success.
  if (status == 0) {
    errno = 0;
    const bool flushed = std::fflush(stdout) == 0;
    const int error = errno;
    if (!flushed || std::ferror(stdout)) {
      status = report("cannot write the standard output: ", error != 0 ? std::strerror(error) : "write error", "", 2);
    }
  }
  if (status != 0) {
    std::fflush(nullptr);
    // In an MPI launch, the launcher ends the whole job as soon as one process exits with an error. The other
    // processes learn of this one's failure at once (docs/SCALE_OUT.md) and report it themselves: a second of
    // grace lets them, before the launcher kills them.
    if (dpe::launched_by_mpi()) sleep(1);
    std::_Exit(status);
  }
  return 0;
}
