// Note [A run's configuration]
// What `dpe train` was told, by option name, with the value the command line gave or its default, generated
// from the command's options so that a new option is covered without a line here. Two uses:
//  - across time: kept with its checkpoints, every option but those that may change between a run and its
//    resume (where it runs and writes, and how long it goes on: kMayChangeOnResume). `--resume` refuses a changed
//    option, naming it with both values, unless `--override NAME,...` lists it; then it says what changed;
//  - across the processes of one launch (--dist): every option but those that may differ per process (its
//    devices and the paths it reads or writes: kMayDifferPerProcess) must be the same on every rank, checked at
//    start-up before any work, naming the option, the ranks and both values.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "io/checkpoint.h"

namespace dpe::tool {

using RunConfiguration = std::map<std::string, std::string>;  // "--lr" -> "0.05"

// The options that may differ between a run and its resume, and between the processes of one launch.
extern const std::set<std::string> kMayChangeOnResume, kMayDifferPerProcess;

// "--a, --b" (for the help: a test reads the lists there).
std::string option_list(const std::set<std::string>& names);

// `cmd`'s options (after parsing) but `excluded`, --help and the hidden ones: given values joined by ",", or
// the default ("" for a flag not given).
RunConfiguration run_configuration(const CLI::App& cmd, const std::set<std::string>& excluded);

// Under --dist: every process's `entries` against process 0's, through the MPI backend (one member per process,
// the collectives' `timeout`). Throws on every process alike when one differs: `disagreement` ("the processes
// were launched with different options"), the first differing rank, its first differing entry, both values, and
// `hint`. Every process of the launch must call it at the same point.
void check_same_across_processes(const RunConfiguration& entries, const std::string& disagreement,
                                 const std::string& hint, std::chrono::milliseconds timeout);

// Into a checkpoint's training state: metadata "run<name>" ("run--lr").
void record_configuration(const RunConfiguration& configuration, io::TrainingState& state);

// Two recorded values are the same option value: equal text, or the same numbers written differently ("3e-3"
// and "0.003", "8" and "8.0"), item by item in comma-separated lists.
bool same_option_value(const std::string& a, const std::string& b);

// `now` against the configuration a checkpoint's metadata recorded. An option in `overrides` (names without
// the dashes: "lr") may differ: the returned lines say what changed. Any other difference throws naming the
// option, both values and --override; so does an override that names no option of the command. A checkpoint
// that recorded no configuration is not compared (one line says so).
std::vector<std::string> compare_configuration(const RunConfiguration& now, const std::map<std::string, std::string>& metadata,
                                               const std::vector<std::string>& overrides, const std::string& checkpoint);

}  // namespace dpe::tool
