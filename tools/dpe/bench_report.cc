// dpe bench's report (bench.h): the table and its notes (the exchanges' costs, the FMA-peak limit, the GEMM
// choices), the rounds, the split weights and backward profiles, and the --json, --csv and --png files.
#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "core/backends.h"
#include "core/cpu_isa.h"
#include "core/peak_flops.h"
#include "core/kernels/sgemm_choice.h"
#include "models/models.h"
#include "tools/dpe/bench.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/json_report.h"
#include "tools/dpe/subprocess.h"

namespace dpe::tool::bench {

namespace {

// A large model makes less than one sample per second (the 124M Llama on CPUs): decimals then, not "0".
std::string samples_per_s(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof buf, rate < 100 ? "%.2f" : "%.0f", rate);
  return buf;
}

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / 1e6);
  return buf;
}

// Text for a gnuplot double-quoted string or datablock label: letters, digits, space and "._-+" pass, anything
// else becomes '?', so no label can end the string (the values come from known lists; this is a backstop).
std::string gnuplot_label(const std::string& text) {
  std::string out;
  for (char c : text) out += std::isalnum(static_cast<unsigned char>(c)) || std::strchr(" ._-+", c) ? c : '?';
  return out;
}

// Which library ran each float32 GEMM shape of this process's devices (Note [float32 GEMM choice] in
// core/kernels/sgemm_cpu.cc), with what each candidate measured.
void print_sgemm_choices() {
  const kernels::SgemmPolicy policy = kernels::current_sgemm_policy();
  const char* source = std::getenv("DPE_CPU_SGEMM") && *std::getenv("DPE_CPU_SGEMM") ? "DPE_CPU_SGEMM" : "the default";
  if (policy == kernels::SgemmPolicy::Onednn) {
    std::printf("# float32 GEMM: onednn (%s): oneDNN's matmul primitive for A @ B^T of >= %.0e FLOP (Linear's "
                "forward), dnnl_sgemm for the rest; DPE_CPU_SGEMM=auto measures each shape\n",
                source, kernels::kMatmulPrimitiveFlops);
    return;
  }
  if (std::optional<kernels::SgemmBackend> backend = kernels::forced_backend(policy)) {
    std::printf("# float32 GEMM: %s for every shape (%s; DPE_CPU_SGEMM=auto measures each shape)\n",
                std::string(kernels::sgemm_backend_name(*backend)).c_str(), source);
    return;
  }
  std::printf("# float32 GEMM per shape (DPE_CPU_SGEMM=auto: measured once per shape; OpenBLAS core %s):\n",
              openblas_get_corename());
  for (const kernels::SgemmChoice& c : kernels::sgemm_choices()) {
    std::printf("#   %s\n", kernels::describe(c).c_str());
  }
}

// Each data-parallel row against its framework's no-sync row of the same precision and devices: what its
// exchanges cost there (PyTorch: ddp-gloo against ddp-gloo-no-sync).
void print_exchange_costs(const std::vector<Row>& rows) {
  auto no_sync_bound = [](const Row& r) {
    return r.note.empty() && (r.framework == "dpe" ? r.mode == kNoSyncMode : r.config == kPytorchNoSyncConfig);
  };
  auto data_parallel = [](const Row& r) {
    if (!r.note.empty()) return false;
    return r.framework == "dpe" ? r.mode != "single" && r.mode != "single-all" && r.mode != kNoSyncMode
                                : r.config == "ddp-gloo";
  };
  for (const Row& bound : rows) {
    if (!no_sync_bound(bound)) continue;
    std::string shares;
    for (const Row& r : rows) {
      if (data_parallel(r) && r.framework == bound.framework && r.precision == bound.precision &&
          r.devices == bound.devices) {
        shares += (shares.empty() ? "" : ", ") + r.config + " " +
                  std::to_string(std::llround(100 * r.samples_per_s / bound.samples_per_s)) + "%";
      }
    }
    if (!shares.empty()) {
      std::printf("# %s %s exchanges nothing, the most data parallelism gets from these devices: %s of it\n",
                  bound.framework.c_str(), bound.config.c_str(), shares.c_str());
    }
  }
}

// --model llama: a row's model FLOPs utilisation, against the peak of its devices (PyTorch's rows: CPU ones) in
// its precision (core/peak_flops.h); nullopt for a GPU the peak table does not know. Peaks are computed once
// per device list and precision (the CPU's is a probe).
std::optional<double> row_mfu(const BenchArgs& args, const Row& r) {
  static std::map<std::string, std::optional<PeakFlops>> peaks;
  std::vector<Device> devices;
  for (const auto& [device, bytes] : r.peak) devices.push_back(device);
  if (devices.empty()) devices.push_back(Device::cpu(0));
  const ComputePrecision precision = r.precision == "fp32" ? ComputePrecision::FP32 : ComputePrecision::BF16;
  // CPU devices share one machine peak whatever the list: one probe for every CPU row, so rows compare.
  const std::string where = devices[0].is_cpu() ? "cpu" : device_list_str(devices);
  const std::string key = where + "/" + r.precision + "/" + std::to_string(r.processes);
  if (!peaks.contains(key)) peaks[key] = peak_flops(devices, precision, r.processes);
  const std::optional<PeakFlops>& peak = peaks[key];
  if (!peak) return std::nullopt;
  return r.samples_per_s * flops_per_sample(args) / (peak->gflops * 1e9);
}

// --model llama: the model's size, and every row's tokens/s and MFU.
void print_language_model_rates(const BenchArgs& args, const std::vector<Row>& rows) {
  if (!args.llama) return;
  const int64_t tokens = tokens_per_sample(args);
  std::printf("# llama %s: %lld parameters, %.2f MFLOP per token (6 x non-embedding parameters + attention), %lld "
              "tokens per sample\n", args.llama_preset.c_str(),
              static_cast<long long>(nn::llama_size(*args.llama).num_params),
              flops_per_sample(args) / static_cast<double>(tokens) / 1e6, static_cast<long long>(tokens));
  for (const Row& r : rows) {
    char mfu[96] = "unknown (a GPU the peak table does not know: set DPE_PEAK_GFLOPS)";
    if (const std::optional<double> share = row_mfu(args, r)) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100 * *share);
    std::printf("#   %s %s: %.0f tokens/s, MFU %s\n", r.framework.c_str(), r.config.c_str(),
                r.samples_per_s * static_cast<double>(tokens), mfu);
  }
}

// Where each dpe row's peak goes, per device, as the allocator tagged the bytes live at the peak (core/allocator.h):
// parameters, gradients, optimizer state (and its step's temporaries), activations and other temporaries. ZeRO's
// rows and DP's first device show here.
void print_memory(const std::vector<Row>& rows) {
  std::printf("# memory per device at its peak, MB: peak = parameters + gradients + optimizer state + activations "
              "and temporaries\n");
  auto part = [](const std::array<int64_t, kMemoryKinds>& split, MemoryKind k) {
    return split[static_cast<size_t>(k)];
  };
  for (const Row& r : rows) {
    if (r.framework != "dpe" || !r.note.empty() || r.peak_split.size() != r.peak.size()) continue;
    std::string line;
    for (size_t i = 0; i < r.peak.size(); ++i) {
      const auto& split = r.peak_split[i];
      line += "  " + r.peak[i].first.str() + " " + mb(r.peak[i].second) + " = " +
              mb(part(split, MemoryKind::Parameters)) + " + " + mb(part(split, MemoryKind::Gradients)) + " + " +
              mb(part(split, MemoryKind::OptimizerState)) + " + " + mb(part(split, MemoryKind::Activations));
    }
    std::printf("#   %s%s\n", r.config.c_str(), line.c_str());
  }
}

}  // namespace

void print_table(const BenchArgs& args, const std::vector<Row>& rows) {
  std::printf("\n# dpe bench: %s, global batch %lld, %lld timed steps after %lld warm-up, ms per step and phase%s\n",
              args.model.c_str(), static_cast<long long>(args.batch_size), static_cast<long long>(args.steps),
              static_cast<long long>(args.warmup),
              args.repeat > 1 ? (", the median of " + std::to_string(args.repeat) + " rounds").c_str() : "");
  std::printf("%-8s %-16s %3s %10s %7s %8s | %7s %7s %7s %7s %7s %7s %7s %7s | %8s | %s\n", "impl", "config", "dev",
              "samples/s", "scaling", "step", "scatter", "bcast", "fwd", "gather", "loss", "bwd", "reduce", "optim",
              "MB moved", "peak MB per device");
  for (const Row& r : rows) {
    if (!r.note.empty()) {
      std::printf("%-8s %-16s %3d %10s  (%s)\n", r.framework.c_str(), r.config.c_str(), r.devices, "-", r.note.c_str());
      continue;
    }
    std::string peak;
    for (const auto& [d, bytes] : r.peak) peak += d.str() + " " + mb(bytes) + "  ";
    const StepReport& p = r.phases;
    char rate[24];
    std::snprintf(rate, sizeof rate, "%10s", samples_per_s(r.samples_per_s).c_str());
    if (r.framework == "dpe") {
      char scaling[16] = "-";
      if (r.scaling) std::snprintf(scaling, sizeof scaling, "%.0f%%", *r.scaling * 100);
      std::printf("%-8s %-16s %3d %s %7s %8.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f | %8s | %s\n",
                  r.framework.c_str(), r.config.c_str(), r.devices, rate, scaling, r.step_ms,
                  p.scatter_ms, p.broadcast_ms, p.forward_ms, p.gather_ms, p.loss_ms, p.backward_ms, p.reduce_ms,
                  p.optimizer_ms, mb(p.scatter.bytes + p.broadcast.bytes + p.gather.bytes + p.reduce.bytes).c_str(),
                  peak.c_str());
    } else {
      // PyTorch's CPU rows: each process's peak resident set, which stands for its device's memory; its GPU
      // rows: the caching allocator's peak.
      std::string memory;
      for (size_t i = 0; i < r.peak_rss.size(); ++i) {
        memory += (i == 0 ? "   peak RSS MB: " : "") + std::string("process ") + std::to_string(i) + " " +
                  mb(r.peak_rss[i]) + "  ";
      }
      if (r.peak_cuda > 0) memory += "   peak CUDA MB: " + mb(r.peak_cuda);
      std::printf("%-8s %-16s %3d %s %7s %8.2f |%s\n", r.framework.c_str(), r.config.c_str(), r.devices, rate, "",
                  r.step_ms, memory.c_str());
    }
  }
  print_exchange_costs(rows);
  print_memory(rows);
  print_language_model_rates(args, rows);
  // The CPU's FMA peak and GEMM choices describe CPU devices: a table of CUDA devices ends with its rows.
  const bool on_cpu = std::ranges::all_of(rows, [](const Row& r) {
    return std::ranges::all_of(r.peak, [](const auto& entry) { return entry.first.is_cpu(); });
  });
  if (!on_cpu) {
    std::printf("# cuDNN convolutions: %s\n", backends::cudnn::benchmark()
                    ? "the fastest measured algorithm per shape (--cudnn-benchmark)"
                    : "cuDNN's heuristics, deterministic algorithms first (--cudnn-benchmark measures them)");
    return;
  }
  const double flops = flops_per_sample(args);
  int64_t processes = 1;
  for (const Row& r : rows) processes = std::max(processes, r.processes);
  // CPU devices share the machine: its FMA peak (or DPE_PEAK_GFLOPS), whatever the device count.
  const PeakFlops peak = *peak_flops({Device::cpu(0)}, ComputePrecision::FP32, processes);
  std::printf("# CPU instruction set: %s\n", cpu_isa_description().c_str());
  if (args.llama) return print_sgemm_choices();  // the MFU lines above hold the rows against the same peak
  std::printf("# FMA-peak limit: %.0f samples/s (%s / %.2f MFLOP per sample)\n", peak.gflops * 1e9 / flops,
              peak.source.c_str(), flops / 1e6);
  for (const Row& r : rows) {
    if (r.note.empty()) {
      // A 16-bit row's products run on other units (bfloat16 dot products, AMX tiles, tensor cores), which
      // the float32 FMA limit does not bound: its share says how much faster than that limit it went.
      std::printf("#   %s %s: %.0f%% of it%s\n", r.framework.c_str(), r.config.c_str(),
                  100 * r.samples_per_s * flops / (peak.gflops * 1e9),
                  r.precision == "fp32" ? "" : " (16-bit products: not bound by the float32 FMA limit)");
    }
  }
  print_sgemm_choices();
}

void print_rounds(const std::vector<Row>& rows) {
  if (rows.front().rounds.empty()) return;
  std::printf("# %zu interleaved rounds: each row is its median round, its scaling the median of the rounds' own "
              "(against the same round's single row); every round:\n", rows.front().rounds.size());
  for (const Row& r : rows) {
    std::string samples, scalings;
    for (const Row::Round& round : r.rounds) {
      samples += (samples.empty() ? "" : ", ") + samples_per_s(round.samples_per_s);
      if (round.config != r.config) samples += " (" + round.config + ")";
      if (round.scaling) {
        scalings += (scalings.empty() ? "; scaling " : ", ") + std::to_string(std::llround(*round.scaling * 100)) + "%";
      }
    }
    std::printf("#   %s %s: %s samples/s%s\n", r.framework.c_str(), r.config.c_str(), samples.c_str(),
                scalings.c_str());
  }
}

void print_split_weights(const std::vector<Row>& rows, const std::vector<Device>& devices) {
  for (const Row& r : rows) {
    if (r.split_weights.empty()) continue;
    std::printf("# %s split auto:", r.config.c_str());
    for (size_t d = 0; d < r.split_weights.size(); ++d) {
      std::printf("  %s %.3f (%.4f ms/sample)", devices[d].str().c_str(), r.split_weights[d], r.ms_per_sample[d]);
    }
    std::printf("\n");
  }
}

void print_backward_profile(const Row& r, const std::vector<Device>& devices) {
  double total = 0;
  for (const autograd::NodeTime& n : r.backward_profile) total += n.ms;
  const double steps = static_cast<double>(r.profiled_steps);
  // Single rows ran on the first device; --dist mpi rows count every process's devices, but time this one's.
  const std::vector<Device> ran(devices.begin(), devices.begin() + std::min<size_t>(r.devices, devices.size()));
  std::printf("\n# %s backward by node on %s, per step (%lld profiled steps after the timed ones; %s)\n",
              r.config.c_str(), device_list_str(ran).c_str(), static_cast<long long>(r.profiled_steps),
              devices[0].is_cpu() ? "wall time" : "stream time between events around each node");
  std::printf("%-34s %10s %9s %6s\n", "node", "calls/step", "ms/step", "share");
  for (const autograd::NodeTime& n : r.backward_profile) {
    std::printf("%-34s %10.1f %9.3f %5.1f%%\n", n.name.c_str(), static_cast<double>(n.calls) / steps, n.ms / steps,
                total > 0 ? 100 * n.ms / total : 0.0);
  }
  std::printf("%-34s %10s %9.3f\n", "total", "", total / steps);
}

void write_outputs(const BenchArgs& args, const std::vector<Row>& rows) {
  if (!args.csv.empty()) {
    std::ofstream out(args.csv);
    DPE_CHECK(out.good(), "--csv ", args.csv, ": cannot open for writing");
    out << "framework,config,devices,samples_per_s,scaling,step_ms,scatter_ms,broadcast_ms,forward_ms,gather_ms,"
           "loss_ms,backward_ms,reduce_ms,optimizer_ms,bytes_moved,peak_bytes_max\n";
    for (const Row& r : rows) {
      int64_t peak = 0;
      for (const auto& [d, b] : r.peak) peak = std::max(peak, b);
      for (int64_t b : r.peak_rss) peak = std::max(peak, b);
      peak = std::max(peak, r.peak_cuda);
      const StepReport& p = r.phases;
      out << r.framework << ',' << r.config << ',' << r.devices << ',' << r.samples_per_s << ',';
      if (r.scaling) out << *r.scaling;  // empty without a single row
      out << ',' << r.step_ms << ',' << p.scatter_ms << ',' << p.broadcast_ms << ',' << p.forward_ms << ','
          << p.gather_ms << ',' << p.loss_ms << ',' << p.backward_ms << ',' << p.reduce_ms << ',' << p.optimizer_ms << ','
          << p.scatter.bytes + p.broadcast.bytes + p.gather.bytes + p.reduce.bytes << ',' << peak << '\n';
    }
    out.close();
    DPE_CHECK(out.good(), "--csv ", args.csv, ": write failed");
  }
  if (!args.json.empty()) {
    // Written with nlohmann-json: strings (the PyTorch script's configs and notes among them) escaped. Numbers
    // keep the 6 significant digits the report always had (as_printed).
    using Json = JsonReport;
    Json report = {
        {"model", args.model}, {"batch_size", args.batch_size}, {"steps", args.steps}, {"repeat", args.repeat},
        {"rows", Json::array()}};
    const DisposeOnExit dispose_report(report);  // Note [A report's destructor allocates] (json_report.h)
    for (const Row& r : rows) {
      const StepReport& p = r.phases;
      Json row = {{"framework", r.framework},
                  {"config", r.config},
                  {"precision", r.precision},
                  {"devices", r.devices},
                  {"samples_per_s", as_printed("%g", r.samples_per_s)},
                  {"scaling", r.scaling ? Json(as_printed("%g", *r.scaling)) : Json(nullptr)},
                  {"step_ms", as_printed("%g", r.step_ms)},
                  {"phases_ms", {{"scatter", as_printed("%g", p.scatter_ms)},
                                 {"broadcast", as_printed("%g", p.broadcast_ms)},
                                 {"forward", as_printed("%g", p.forward_ms)},
                                 {"gather", as_printed("%g", p.gather_ms)},
                                 {"loss", as_printed("%g", p.loss_ms)},
                                 {"backward", as_printed("%g", p.backward_ms)},
                                 {"reduce", as_printed("%g", p.reduce_ms)},
                                 {"optimizer", as_printed("%g", p.optimizer_ms)}}},
                  {"peak_bytes", Json::object()}};
      if (!r.split_weights.empty()) {
        row["split_weights"] = Json::array();
        row["ms_per_sample"] = Json::array();
        for (size_t d = 0; d < r.split_weights.size(); ++d) {
          row["split_weights"].push_back(as_printed("%.4f", r.split_weights[d]));
          row["ms_per_sample"].push_back(as_printed("%.5f", r.ms_per_sample[d]));
        }
      }
      for (const auto& [device, bytes] : r.peak) row["peak_bytes"][device.str()] = bytes;
      if (!r.peak_rss.empty()) row["peak_rss_bytes"] = r.peak_rss;  // PyTorch's processes, by rank
      if (r.peak_cuda > 0) row["peak_cuda_bytes"] = r.peak_cuda;      // PyTorch on a GPU
      if (r.peak_split.size() == r.peak.size() && !r.peak.empty()) {
        // memory_bytes[device][kind]: the peak's parts (print_memory), by memory_kind_name.
        row["memory_bytes"] = Json::object();
        for (size_t i = 0; i < r.peak.size(); ++i) {
          Json parts = Json::object();
          for (size_t k = 0; k < kMemoryKinds; ++k) {
            parts[memory_kind_name(static_cast<MemoryKind>(k))] = r.peak_split[i][k];
          }
          row["memory_bytes"][r.peak[i].first.str()] = parts;
        }
      }
      if (!r.note.empty()) row["note"] = r.note;
      if (!r.rounds.empty()) {
        row["rounds"] = Json::array();
        for (const Row::Round& round : r.rounds) {
          row["rounds"].push_back({{"config", round.config},
                                   {"samples_per_s", as_printed("%g", round.samples_per_s)},
                                   {"scaling", round.scaling ? Json(as_printed("%g", *round.scaling)) : Json(nullptr)}});
        }
      }
      if (r.profiled_steps > 0) {
        row["backward_profile"] = Json::array();
        const double steps = static_cast<double>(r.profiled_steps);
        for (const autograd::NodeTime& n : r.backward_profile) {
          row["backward_profile"].push_back({{"node", n.name},
                                             {"calls_per_step", as_printed("%g", static_cast<double>(n.calls) / steps)},
                                             {"ms_per_step", as_printed("%g", n.ms / steps)}});
        }
      }
      if (args.llama) {
        row["tokens_per_s"] = as_printed("%g", r.samples_per_s * static_cast<double>(tokens_per_sample(args)));
        const std::optional<double> mfu = row_mfu(args, r);
        row["mfu"] = mfu ? Json(as_printed("%.4f", *mfu)) : Json(nullptr);
      }
      report["rows"].push_back(std::move(row));
    }
    write_json_report("--json", args.json, report);
  }
  if (!args.png.empty()) {
    // gnuplot gets its script on stdin (the bars inline, as a datablock) and writes the PNG to its stdout;
    // we write that to --png ourselves. So the user's path never appears in gnuplot's language, where a quote
    // would end a string, a leading '|' would pipe into a command, and `...` would run one.
    std::ostringstream gp;
    gp << "$bars << EOD\n";
    double highest = 0;
    for (const Row& r : rows) {
      if (!r.note.empty()) continue;
      gp << '"' << gnuplot_label(r.framework + ' ' + r.config) << "\" " << r.samples_per_s << '\n';
      highest = std::max(highest, r.samples_per_s);
    }
    gp << "EOD\n"
       << "set terminal png size 900,500\n"
       << "set title \"dpe bench: " << gnuplot_label(args.model) << ", global batch " << args.batch_size << "\"\n"
       << "set ylabel 'samples/s'\nset style fill solid 0.6\nset boxwidth 0.6\nset grid ytics\n"
       << "set yrange [0:" << (highest > 0 ? highest * 1.15 : 1.0) << "]\n"  // room for the labels above the bars
       << "set xtics rotate by -30\nplot $bars using 0:2:xtic(1) with boxes notitle, $bars using 0:2:(sprintf('%.0f',$2)) "
          "with labels offset 0,1 notitle\n";
    ProcessResult result;
    try {
      result = run_process({"gnuplot"}, gp.str(), {.seconds = 60, .output_bytes = size_t{64} << 20});
    } catch (const Error& e) {
      // Only a gnuplot that is not there needs installing: a failure to start it (no file descriptors or
      // processes left) says what it was.
      const bool missing = find_program("gnuplot").empty();
      throw Error(std::string("--png: ") + e.what() + (missing ? "; install gnuplot with apt-get install gnuplot-nox" : ""));
    }
    DPE_CHECK(result.ok() && result.output.rfind("\x89PNG", 0) == 0, "--png: gnuplot failed (", describe_status(result),
              ")", result.ok() ? ": its output is not a PNG image" : "");
    std::ofstream png(args.png, std::ios::binary);
    png.write(result.output.data(), static_cast<std::streamsize>(result.output.size()));
    png.close();
    DPE_CHECK(png.good(), "--png ", args.png, ": cannot write the image");
  }
}

}  // namespace dpe::tool::bench
