// Running another program without a shell: the dpe tool starts python3 (dpe bench --compare-pytorch) and
// gnuplot (dpe bench --png) with an argument vector, so nothing a user typed (a path with a quote, a `$(...)`,
// a semicolon) is ever interpreted: each argument reaches the program as one argv element, verbatim.
//
//   ProcessResult r = run_process({"gnuplot"}, script);  // script on stdin, the PNG comes back on stdout
//   DPE_CHECK(r.ok(), "gnuplot failed: ", describe_status(r));
//
// Contract: posix_spawnp (PATH is searched when argv[0] has no '/'); the child's standard input is a pipe
// fed with `input` then closed (so a program that reads stdin sees end-of-file, never the user's terminal),
// its standard output a pipe read into ProcessResult::output, its standard error ours (progress and error
// messages reach the user as they happen). Input and output are pumped together (poll), so neither side can
// block the other whatever their sizes; a child that exits without reading its input is not an error
// (SIGPIPE is blocked on the calling thread while it writes). Every child runs under limits: one that runs
// past its time or writes more than its output cap is killed (SIGKILL to the child; processes it started
// itself are its own), and the result says which. run_process returns after the child exited.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dpe::tool {

inline constexpr double kMaxHelperSeconds = 1e7;

struct ProcessLimits {
  double seconds = 60;                 // wall time from the start, in (0, kMaxHelperSeconds]
  size_t output_bytes = size_t{64} << 20;  // standard output kept at most; more is an error
};

struct ProcessResult {
  int exit_status = 0;  // the exit code (0 when a signal ended the child)
  int signal = 0;       // the signal that ended the child, or 0
  bool timed_out = false;        // killed: ran past ProcessLimits::seconds
  bool output_exceeded = false;  // killed: wrote more than ProcessLimits::output_bytes
  double limit_seconds = 0;      // the limits it ran under, for describe_status
  size_t limit_output_bytes = 0;
  std::string output;   // what the child wrote to its standard output (at most the limit)
  bool ok() const { return exit_status == 0 && signal == 0 && !timed_out && !output_exceeded; }
};

// Throws dpe::Error, naming the program and the reason, when argv is empty or the program cannot be
// started (not found, not executable, no file descriptors or processes left: strerror says which).
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input = {},
                          const ProcessLimits& limits = {});

// Where run_process would find `program`: itself when it contains a '/', else the first executable regular
// file of that name in PATH's directories; "" when there is none. For start-up checks (a missing gnuplot is
// reported before a benchmark runs, not after).
std::string find_program(const std::string& program);

// "exit status 3", "killed by signal 9 (Killed)", "killed after running past its 60-s limit", "killed after
// writing more than 64 MiB to its standard output"
std::string describe_status(const ProcessResult& result);

// The lines of `text`, without their '\n' (a last line without '\n' counts).
std::vector<std::string> split_lines(const std::string& text);

}  // namespace dpe::tool
