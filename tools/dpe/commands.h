// The dpe tool's subcommands. Each add_*_command registers one subcommand (options, --help text, callback)
// on the root app; callbacks throw dpe::Error on bad input, which main() prints and turns into exit status 2.
#pragma once

#include <CLI/CLI.hpp>

namespace dpe::tool {

void add_devices_command(CLI::App& app);
void add_collectives_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);

}  // namespace dpe::tool
