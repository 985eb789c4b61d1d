// Note [A run's configuration]
// What `dpe train` was told, kept with its checkpoints, so that a resumed run is the same run: every option
// of the command but those that may change between a run and its resume (where it runs and writes, and how long
// it goes on: kMayChangeOnResume), by name, with the value the command line gave or its default. The list is
// generated from the command's options, so a new option is covered without a line here. `--resume` compares
// the checkpoint's configuration with its own and refuses a changed option, naming it with both values, unless
// `--override NAME,...` lists it; then it says what changed.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "io/checkpoint.h"

namespace dpe::tool {

using RunConfiguration = std::map<std::string, std::string>;  // "--lr" -> "0.05"

// The options that may differ between a run and its resume.
extern const std::set<std::string> kMayChangeOnResume;

// `cmd`'s options (after parsing) but kMayChangeOnResume and --override: given values joined by ",", or the
// default ("" for a flag not given).
RunConfiguration run_configuration(const CLI::App& cmd);

// Into a checkpoint's training state: metadata "run<name>" ("run--lr").
void record_configuration(const RunConfiguration& configuration, io::TrainingState& state);

// `now` against the configuration a checkpoint's metadata recorded. An option in `overrides` (names without
// the dashes: "lr") may differ: the returned lines say what changed. Any other difference throws naming the
// option, both values and --override; so does an override that names no option of the command. A checkpoint
// that recorded no configuration is not compared (one line says so).
std::vector<std::string> compare_configuration(const RunConfiguration& now, const std::map<std::string, std::string>& metadata,
                                               const std::vector<std::string>& overrides, const std::string& checkpoint);

}  // namespace dpe::tool
