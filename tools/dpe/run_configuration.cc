#include "tools/dpe/run_configuration.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "collectives/process_group.h"
#include "core/error.h"

namespace dpe::tool {

namespace {

constexpr const char* kPrefix = "run";

}  // namespace

const std::set<std::string> kMayChangeOnResume = {
    "--resume", "--override", "--checkpoint", "--json", "--save-every", "--epochs", "--stop-at-step",  // where, how long
    "--device-ids", "--cpu-devices", "--output-device", "--dist", "--mode", "--split", "--zero",  // where it runs
    "--timeout", "--on-device-failure", "--activation-checkpointing", "--data-dir",
};

// --resume and --data-dir: each process may read its own copy; what the copies hold is compared instead
// (input_identity.h).
const std::set<std::string> kMayDifferPerProcess = {
    "--device-ids", "--cpu-devices", "--output-device", "--json", "--checkpoint", "--data-dir", "--resume",
};

std::string option_list(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

namespace {

// `text` as a finite number when all of it is one.
std::optional<double> number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::vector<std::string> items(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

bool same_option_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const std::vector<std::string> x = items(a), y = items(b);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    const std::optional<double> u = number(x[i]), v = number(y[i]);
    if (!u || !v || *u != *v) return false;
  }
  return true;
}

RunConfiguration run_configuration(const CLI::App& cmd, const std::set<std::string>& excluded) {
  RunConfiguration configuration;
  for (const CLI::Option* option : cmd.get_options()) {
    const std::string name = option->get_name();
    // Hidden options are the tests' fault injection, which may differ anywhere.
    if (name.rfind("--", 0) != 0 || name == "--help" || option->get_group().empty() || excluded.contains(name)) {
      continue;
    }
    std::string value;
    if (option->count() > 0) {
      for (const std::string& result : option->results()) value += (value.empty() ? "" : ",") + result;
    } else {
      value = option->get_default_str();
    }
    configuration[name] = value;
  }
  return configuration;
}

void record_configuration(const RunConfiguration& configuration, io::TrainingState& state) {
  for (const auto& [name, value] : configuration) state.metadata[kPrefix + name] = value;
}

std::vector<std::string> compare_configuration(const RunConfiguration& now, const std::map<std::string, std::string>& metadata,
                                               const std::vector<std::string>& overrides, const std::string& checkpoint) {
  for (const std::string& name : overrides) {
    DPE_CHECK(now.contains("--" + name), "--override ", name, ": not an option of dpe train that shapes the "
              "training (", kMayChangeOnResume.contains("--" + name) ? "it may change on resume anyway" : "no such option",
              ")");
  }
  RunConfiguration saved;
  for (const auto& [key, value] : metadata) {
    if (key.rfind(std::string(kPrefix) + "--", 0) == 0) saved[key.substr(std::string(kPrefix).size())] = value;
  }
  if (saved.empty()) return {"--resume " + checkpoint + ": it recorded no configuration; the options were not compared"};
  std::vector<std::string> changed;
  auto value_of = [](const RunConfiguration& c, const std::string& name) {
    const auto it = c.find(name);
    return it == c.end() ? std::string("(not an option then)") : "'" + it->second + "'";
  };
  std::set<std::string> names;
  for (const auto& [name, value] : now) names.insert(name);
  for (const auto& [name, value] : saved) names.insert(name);
  for (const std::string& name : names) {
    if (now.contains(name) && saved.contains(name) && same_option_value(now.at(name), saved.at(name))) continue;
    const bool overridden = std::ranges::find(overrides, name.substr(2)) != overrides.end();
    DPE_CHECK(overridden, "--resume ", checkpoint, ": ", name, " was ", value_of(saved, name),
              " in the checkpoint's run and is ", value_of(now, name), " now; a resumed run keeps its configuration "
              "(pass --override ", name.substr(2), " to change it)");
    changed.push_back(name + " changed from " + value_of(saved, name) + " to " + value_of(now, name) + " (--override)");
  }
  return changed;
}

namespace {

std::vector<uint8_t> as_bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::string encoded(const RunConfiguration& configuration) { return nlohmann::json(configuration).dump(); }

RunConfiguration decoded(const std::vector<uint8_t>& bytes) {
  return nlohmann::json::parse(bytes.begin(), bytes.end()).get<RunConfiguration>();
}

}  // namespace

// Process 0's configuration is broadcast as one object; every process finds its first difference; an
// all-reduce (min) agrees on the first rank that differs, and that rank's description of the difference is
// broadcast, so that every process throws the same message before any work.
void check_same_across_processes(const RunConfiguration& entries, const std::string& disagreement,
                                 const std::string& hint, std::chrono::milliseconds timeout) {
  ProcessGroup group({Device::cpu(0)}, {.backend = CollectiveBackend::Mpi, .timeout = timeout});
  const int world = group.world_size(), rank = group.global_rank(0);
  const RunConfiguration reference = decoded(group.broadcast_object(0, as_bytes(encoded(entries)), 0));
  std::string difference;
  std::set<std::string> names;
  for (const auto& [name, value] : entries) names.insert(name);
  for (const auto& [name, value] : reference) names.insert(name);
  for (const std::string& name : names) {
    const auto mine = entries.find(name), theirs = reference.find(name);
    if (mine != entries.end() && theirs != reference.end() && same_option_value(mine->second, theirs->second)) {
      continue;
    }
    const std::string a = theirs == reference.end() ? "(none)" : "'" + theirs->second + "'";
    const std::string b = mine == entries.end() ? "(none)" : "'" + mine->second + "'";
    difference = detail::str_cat(name, ": rank 0 has ", a, ", rank ", rank, " has ", b);
    break;
  }
  Tensor first = Tensor::from_vector(std::vector<int64_t>{difference.empty() ? world : rank}, {1},
                                     TensorOptions(DType::Int64));
  group.all_reduce(0, first, ReduceOp::Min);
  const int root = static_cast<int>(first.to_vector<int64_t>()[0]);
  if (root == world) return;
  const std::vector<uint8_t> described = group.broadcast_object(0, as_bytes(difference), root);
  DPE_CHECK(false, "--dist: ", disagreement, "; ", std::string(described.begin(), described.end()), " (", hint, ")");
}

}  // namespace dpe::tool
