#include "tools/dpe/cli_util.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace dpe::tool {

namespace {

// "a,b,c" -> {"a", "b", "c"}, each item non-empty: "<label> 'a,,b': item 2 is empty; expected <expected>".
// The caller checks that `text` is not empty (its message names what was expected).
std::vector<std::string> split_items(const std::string& label, const std::string& text, const char* expected) {
  std::vector<std::string> items;
  size_t start = 0;
  for (int position = 1;; ++position) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    DPE_CHECK(!item.empty(), label, " '", text, "': item ", position, " is empty; expected ", expected);
    items.push_back(std::move(item));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}


std::vector<Device> parse_list(const std::string& label, const std::string& list) {
  DPE_CHECK(!list.empty(), label, " '': expected at least one device, e.g. cpu:0,cpu:1");
  std::vector<Device> devices;
  int position = 0;
  for (const std::string& item : split_items(label, list, "devices separated by single commas, e.g. cpu:0,cpu:1")) {
    ++position;
    try {
      devices.push_back(Device::parse(item));
    } catch (const Error& e) {
      throw Error(dpe::detail::str_cat(label, " '", list, "': item ", position, ": ", e.what()));
    }
  }
  return devices;
}

// Strictly a decimal integer: an optional sign, then digits only. Sets *value; false on anything else or on
// overflow of int64.
bool parse_decimal(std::string_view digits, int64_t* value) {
  if (!digits.empty() && digits[0] == '+') {
    digits.remove_prefix(1);
    if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) return false;
  }
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *value);
  return ec == std::errc() && end == digits.data() + digits.size();
}

// "K", "KB", "KiB" (any case) -> 2^10; M, G, T likewise; "" -> 1. 0 when not a suffix.
int64_t suffix_multiplier(std::string suffix) {
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.empty()) return 1;
  const std::string units = "KMGT";
  const size_t unit = units.find(suffix[0]);
  if (unit == std::string::npos) return 0;
  const std::string rest = suffix.substr(1);
  if (!rest.empty() && rest != "B" && rest != "IB") return 0;
  return int64_t{1} << (10 * (unit + 1));
}

}  // namespace

std::string join_commas(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

std::vector<Device> parse_device_list(const std::string& list) { return parse_list("device list", list); }

std::vector<Device> parse_device_option(const std::string& option, const std::string& list) {
  return parse_list(option, list);
}

void check_device_ids(const std::string& option, const std::vector<Device>& devices) {
  DPE_CHECK(static_cast<int64_t>(devices.size()) <= kMaxDevices, option, " lists ", devices.size(),
            " devices; expected at most ", kMaxDevices);
  for (size_t i = 0; i < devices.size(); ++i) {
    try {
      check_device_exists(devices[i]);
    } catch (const Error& e) {
      throw Error(option + ": " + e.what());
    }
    DPE_CHECK(devices[i].kind == devices[0].kind, option, " mixes ", devices[0], " and ", devices[i],
              "; expected devices of one kind");
    for (size_t j = 0; j < i; ++j) {
      DPE_CHECK(devices[j] != devices[i], option, " lists ", devices[i], " more than once (items ", j + 1, " and ",
                i + 1, "); expected distinct devices");
    }
  }
}

std::string device_list_str(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) out += (out.empty() ? "" : " ") + d.str();
  return out;
}

std::vector<Device> default_devices(int cpu_count, bool cpu_count_given) {
  if (cuda_available() && !cpu_count_given) return all_devices(DeviceKind::CUDA);
  if (num_cpu_devices() < cpu_count) set_num_cpu_devices(cpu_count);
  std::vector<Device> devices;
  for (int i = 0; i < cpu_count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

std::string bytes_str(double bytes) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  while (bytes >= 1024 && u < 3) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes == static_cast<int64_t>(bytes) ? "%.0f%s" : "%.1f%s", bytes, units[u]);
  return buf;
}

std::string bound_str(int64_t v) {
  if (v >= (int64_t{1} << 16) && (v & (v - 1)) == 0) return "2^" + std::to_string(std::countr_zero(static_cast<uint64_t>(v)));
  if (v == std::numeric_limits<int64_t>::max()) return "2^63-1";
  return std::to_string(v);
}

int64_t parse_int(const std::string& option, const std::string& text, int64_t lo, int64_t hi, bool size_suffixes) {
  auto fail = [&] {
    DPE_CHECK(false, option, " ", text.empty() ? "''" : text, ": expected an integer in [", bound_str(lo), ", ",
              bound_str(hi), "]", size_suffixes ? " (a K, M, G or T suffix multiplies by a power of 1024)" : "");
  };
  std::string_view s = text;
  int64_t multiplier = 1;
  if (size_suffixes) {
    size_t end = s.size();
    while (end > 0 && std::isalpha(static_cast<unsigned char>(s[end - 1]))) --end;
    multiplier = suffix_multiplier(std::string(s.substr(end)));
    if (multiplier == 0) fail();
    s = s.substr(0, end);
  }
  int64_t value = 0;
  if (!parse_decimal(s, &value) || __builtin_mul_overflow(value, multiplier, &value)) fail();
  if (value < lo || value > hi) fail();
  return value;
}

uint64_t parse_uint64(const std::string& option, const std::string& text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  DPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size(), option, " ",
            text.empty() ? "''" : text, ": expected an integer in [0, 2^64-1]");
  return value;
}

double parse_real(const std::string& option, const std::string& text, double lo, bool lo_open) {
  double value = 0;
  std::string_view s = text;
  const bool plus = !s.empty() && s[0] == '+';
  if (plus) s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);  // decimal only: no "0x"
  const bool number = !s.empty() && !(plus && (s[0] == '-' || s[0] == '+')) && ec == std::errc() &&
                      end == s.data() + s.size();
  DPE_CHECK(number && std::isfinite(value) && (lo_open ? value > lo : value >= lo), option, " ",
            text.empty() ? "''" : text, ": expected a finite number ", lo_open ? "> " : ">= ", lo);
  return value;
}

namespace detail {

std::string long_name(const std::string& names) {
  std::string best;
  size_t start = 0;
  for (;;) {
    const size_t comma = names.find(',', start);
    const std::string name = names.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.size() > best.size()) best = name;
    if (comma == std::string::npos) return best;
    start = comma + 1;
  }
}

}  // namespace detail

CLI::Option* add_seed_option(CLI::App& cmd, const std::string& names, uint64_t& target, const std::string& description) {
  const std::string name = detail::long_name(names);
  CLI::Option* option = cmd.add_option_function<std::string>(
      names, [&target, name](const std::string& text) { target = parse_uint64(name, text); }, description);
  option->type_name("INT:[0, 2^64-1]");
  option->default_str(std::to_string(target));
  return option;
}

CLI::Option* add_real_option(CLI::App& cmd, const std::string& names, double& target, const std::string& description,
                             double lo, bool lo_open) {
  const std::string name = detail::long_name(names);
  CLI::Option* option = cmd.add_option_function<std::string>(
      names, [&target, name, lo, lo_open](const std::string& text) { target = parse_real(name, text, lo, lo_open); },
      description);
  char bound[64];
  std::snprintf(bound, sizeof bound, "FLOAT:%s%g, inf)", lo_open ? "(" : "[", lo);
  option->type_name(bound);
  char shown[64];
  std::snprintf(shown, sizeof shown, "%g", target);
  option->default_str(shown);
  return option;
}

std::vector<std::string> parse_name_list(const std::string& option, const std::string& text,
                                         const std::vector<std::string>& allowed) {
  DPE_CHECK(!text.empty(), option, " '': expected at least one of ", join_commas(allowed));
  std::vector<std::string> items = split_items(option, text, "names separated by single commas");
  for (size_t i = 0; i < items.size(); ++i) {
    DPE_CHECK(allowed.empty() || std::find(allowed.begin(), allowed.end(), items[i]) != allowed.end(), option, " '",
              text, "': item ", i + 1, " '", items[i], "' is not one of ", join_commas(allowed));
  }
  return items;
}

CLI::Option* add_name_list_option(CLI::App& cmd, const std::string& names, std::vector<std::string>& target,
                                  const std::string& description, const std::vector<std::string>& allowed) {
  const std::string name = detail::long_name(names);
  CLI::Option* option = cmd.add_option_function<std::string>(
      names, [&target, name, allowed](const std::string& text) { target = parse_name_list(name, text, allowed); },
      description);
  option->default_str(join_commas(target));
  if (!allowed.empty()) option->type_name("LIST of {" + join_commas(allowed) + "}");
  return option;
}

}  // namespace dpe::tool
