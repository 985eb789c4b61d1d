// dpe bench's PyTorch side (bench.h): tools/bench/pytorch_reference.py run by python3, its rows read back.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "tools/dpe/bench.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/json_report.h"
#include "tools/dpe/subprocess.h"

namespace dpe::tool::bench {

bool is_pytorch_config(const std::string& c) {
  if (c == "single" || std::ranges::find(kPytorchNamedConfigs, c) != kPytorchNamedConfigs.end()) return true;
  if (c.size() < 9 || c.rfind("single-", 0) != 0 || c.back() != 't') return false;
  const std::string threads = c.substr(7, c.size() - 8);
  if (threads.size() > 4 || !std::all_of(threads.begin(), threads.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return false;
  }
  return std::stoi(threads) > 0;
}

std::string pytorch_config_list(const std::string& threads, const std::string& last_separator) {
  std::string out = "single, single-Nt" + threads;
  for (size_t i = 0; i < kPytorchNamedConfigs.size(); ++i) {
    out += (i + 1 == kPytorchNamedConfigs.size() ? last_separator : ", ") + std::string(kPytorchNamedConfigs[i]);
  }
  return out;
}

std::string pytorch_script_path(const BenchArgs& args) {
  if (!args.pytorch_script.empty()) return args.pytorch_script;
  const char* root = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // set by `bazel run`
  return std::string(root ? root : ".") + "/tools/bench/pytorch_reference.py";
}

std::vector<Row> bench_pytorch(const BenchArgs& args, int64_t samples) {
  const std::string configs = join_commas(args.pytorch_configs);
  // An argument vector: the script path and every value reach python3 verbatim, whatever they contain.
  std::vector<std::string> argv = {args.pytorch_python, pytorch_script_path(args), "--model", args.model,
                                   "--batch", std::to_string(args.batch_size), "--steps",
                                   std::to_string(args.steps), "--warmup", std::to_string(args.warmup),
                                   "--samples", std::to_string(samples), "--configs", configs};
  if (args.llama) {
    // The same model and data shape as dpe's rows: the preset (the script keeps layers/llama.cc's table), the
    // tokens per row as resolved here, the vocabulary of dpe's configuration. Its data are random tokens too.
    argv.insert(argv.end(), {"--llama-preset", args.llama_preset, "--seq-len", std::to_string(tokens_per_sample(args)),
                             "--vocab", std::to_string(args.llama->vocab_size)});
  } else if (!args.data_dir.empty()) {
    argv.insert(argv.end(), {"--data-dir", args.data_dir});
  }
  // Not --channels-last even when dpe's rows are: PyTorch 1.13's CPU CNN is slower in it (docs/BENCHMARKS.md,
  // "Channels last"), and the comparison is against PyTorch's best configuration.
  std::string shown;
  for (const std::string& a : argv) shown += (shown.empty() ? "" : " ") + a;
  std::fprintf(stderr, "running PyTorch: %s\n", shown.c_str());
  ProcessResult result = run_process(argv, {}, {.seconds = args.pytorch_timeout, .output_bytes = size_t{64} << 20});
  std::vector<Row> rows;
  for (const std::string& line : split_lines(result.output)) {
    // One JSON object per configuration; anything else on stdout is not a result.
    const JsonReport r = JsonReport::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || r.value("framework", "") != "pytorch") continue;
    auto number = [&](const char* key) { return r.contains(key) && r[key].is_number() ? r[key].get<double>() : 0.0; };
    Row row;
    row.framework = "pytorch";
    row.config = r.value("config", "?");
    row.devices = static_cast<int>(std::max(1.0, number("processes")));
    row.samples_per_s = number("samples_per_s");
    row.step_ms = number("step_ms");
    if (r.contains("skipped")) row.note = "skipped";
    if (r.contains("peak_rss_bytes") && r["peak_rss_bytes"].is_array()) {
      for (const auto& bytes : r["peak_rss_bytes"]) {
        if (bytes.is_number()) row.peak_rss.push_back(bytes.get<int64_t>());
      }
    }
    row.peak_cuda = static_cast<int64_t>(number("peak_cuda_bytes"));
    rows.push_back(row);
  }
  DPE_CHECK(result.ok() && !rows.empty(), "--compare-pytorch: ", shown, " failed (", describe_status(result), ", ",
            rows.size(), " result rows)",
            result.timed_out         ? "; --pytorch-timeout gives it longer"
            : result.output_exceeded ? ""
                                     : "; it needs Debian's python3-torch (apt-get install python3-torch)");
  return rows;
}

}  // namespace dpe::tool::bench
