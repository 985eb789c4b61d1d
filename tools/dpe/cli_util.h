// Small helpers shared by the dpe tool's subcommands: strict parsers for what users type (device lists,
// numbers), numeric options with explicit ranges (file options: file_args.h).
//
// Contract: every parser and check throws dpe::Error on bad input, with a message that names the option (or
// "device list"), the offending text and what was expected; none of them builds, loads or writes anything,
// so a command can run them all before any expensive work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/device.h"

namespace dpe::tool {

// "cpu:0,cpu:1" -> devices, strictly: an empty list, an empty item ("cpu:0,,cpu:1", a trailing comma) or a
// bad device string is an error naming the item's 1-based position. Does not check that the devices exist
// (check_device_exists, core/device.h) nor that they are distinct (DataParallel and ProcessGroup do).
std::vector<Device> parse_device_list(const std::string& list);
// The same, with messages that start with the option's name ("--device-ids 'cpu:0,': item 2 is empty; ...").
std::vector<Device> parse_device_option(const std::string& option, const std::string& list);
// Throws unless the list has at most kMaxDevices entries, every device exists (check_device_exists), no device
// is listed twice and all are of one kind (what DataParallel and ProcessGroup require, checked before anything
// is built); messages start with the option's name.
inline constexpr int64_t kMaxDevices = kMaxLogicalDevices;  // also --cpu-devices' bound
void check_device_ids(const std::string& option, const std::vector<Device>& devices);
// "cpu:0 cpu:1"
std::string device_list_str(const std::vector<Device>& devices);
// Every CUDA device if there is one and the user gave no CPU device count, else `cpu_count` CPU devices (raising
// the CPU device count if needed): `--cpu-devices 3` means three CPU devices on a machine with a GPU too.
std::vector<Device> default_devices(int cpu_count, bool cpu_count_given = false);
// 1024 -> "1K", 64 << 20 -> "64M"
std::string bytes_str(double bytes);
// 1048576 -> "2^20", 1000 -> "1000": how ranges are shown in messages and --help.
std::string bound_str(int64_t v);

// Numbers as typed: a decimal integer (optional sign, digits, nothing else; with size_suffixes also K, M, G
// or T, optionally followed by B or iB, as powers of 1024) within [lo, hi]. Text that is not such an integer,
// or overflows, is an error like "--epochs 99999999999999999999999: expected an integer in [1, 1000000]".
int64_t parse_int(const std::string& option, const std::string& text, int64_t lo, int64_t hi,
                  bool size_suffixes = false);
// Any unsigned 64-bit decimal integer (seeds).
uint64_t parse_uint64(const std::string& option, const std::string& text);
// A finite decimal number (no inf, nan or hex) that is > lo (lo_open) or >= lo.
double parse_real(const std::string& option, const std::string& text, double lo, bool lo_open);

// Numeric options. CLI11 converts out-of-range integers to the type's limit without a word and describes
// PositiveNumber with a 300-digit bound, so every numeric option of the tool is registered through these:
// the text is parsed by the functions above when CLI11 processes the option, their dpe::Error propagates out
// of CLI::App::parse (main prints it, exit status 2), and --help shows the range and the default.
// `target` must outlive the App's parse.
template <typename T>
CLI::Option* add_int_option(CLI::App& cmd, const std::string& names, T& target, const std::string& description,
                            int64_t lo, int64_t hi, bool size_suffixes = false);
CLI::Option* add_seed_option(CLI::App& cmd, const std::string& names, uint64_t& target, const std::string& description);
CLI::Option* add_real_option(CLI::App& cmd, const std::string& names, double& target, const std::string& description,
                             double lo, bool lo_open);

// "a,b,c": a name list as the options take it.
std::string join_commas(const std::vector<std::string>& items);

// A comma-separated list of names (--modes, --ops, --pytorch-configs). CLI11's own delimiter drops empty
// items without a word, so these are split like the device lists: every item non-empty and, when `allowed` is
// not empty, one of it; else "--modes 'single,,dp': item 2 is empty" (exit status 2).
std::vector<std::string> parse_name_list(const std::string& option, const std::string& text,
                                         const std::vector<std::string>& allowed);
CLI::Option* add_name_list_option(CLI::App& cmd, const std::string& names, std::vector<std::string>& target,
                                  const std::string& description, const std::vector<std::string>& allowed = {});

// ---- implementation of the templates ----

namespace detail {
// "-b,--min-bytes" -> "--min-bytes": the name messages use.
std::string long_name(const std::string& names);
}  // namespace detail

template <typename T>
CLI::Option* add_int_option(CLI::App& cmd, const std::string& names, T& target, const std::string& description,
                            int64_t lo, int64_t hi, bool size_suffixes) {
  static_assert(std::is_integral_v<T> && std::is_signed_v<T>);
  const std::string name = detail::long_name(names);
  CLI::Option* option = cmd.add_option_function<std::string>(
      names,
      [&target, name, lo, hi, size_suffixes](const std::string& text) {
        target = static_cast<T>(parse_int(name, text, lo, hi, size_suffixes));
      },
      description);
  option->type_name("INT:[" + bound_str(lo) + ", " + bound_str(hi) + "]");
  option->default_str(std::to_string(target));
  return option;
}

}  // namespace dpe::tool
