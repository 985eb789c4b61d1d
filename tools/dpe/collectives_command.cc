// dpe collectives: nccl-tests-style table of the process group's collectives (docs/COLLECTIVES.md):
// per size, time per call (averaged over iterations and members), algbw = S / t and busbw = algbw x the
// collective's factor, GB = 1e9, and a correctness count. With --stream it also measures the host's memory
// bandwidth (STREAM triad) and shows the CPU all-reduce against its limit: an in-place all-reduce of S bytes
// moves 4 S bytes through memory on 2 members (each reads both buffers' slices and writes both).
// With --dist mpi the group spans every process of an MPI launch: rows cover all its members (times are the
// mean over them, #wrong their sum), and process 0 prints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/cpu_cores.h"
#include "core/ops.h"
#include "core/stream.h"
#include "engine/worker_pool.h"
#include "collectives/process_group.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/file_args.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/dist_option.h"
#include "tools/dpe/json_report.h"

namespace dpe::tool {

namespace {

struct CollectivesArgs {
  std::optional<std::string> device_ids;
  std::string backend = "auto";
  std::string dist = "none";  // "mpi": one group over the devices of every process of an MPI launch
  std::vector<std::string> ops = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"};
  int64_t min_bytes = 1024, max_bytes = 64 << 20;
  int factor = 4, iters = 20, warmup = 5;
  bool stream = false;
  std::string json;
  int fail_rank = -1;  // hidden, tests only: this member throws in its first collective (see add_collectives_command)
};

bool is_sliced(const std::string& op) { return op != "all_reduce" && op != "broadcast" && op != "reduce"; }

// Float32 elements per member for a row of `bytes`: a multiple of the n members for the sliced collectives
// (0: the size holds no row for this collective).
int64_t element_count(const std::string& op, int64_t bytes, int n) {
  int64_t count = bytes / 4;
  return is_sliced(op) ? count / n * n : count;
}

// The sizes must give every requested collective at least one row: an empty table is an error, not a result.
void check_sizes(const CollectivesArgs& args, int n) {
  DPE_CHECK(args.min_bytes <= args.max_bytes, "--min-bytes ", args.min_bytes, " is larger than --max-bytes ",
            args.max_bytes, "; expected min <= max");
  for (const std::string& op : args.ops) {
    bool any = false;
    for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes && !any; bytes *= args.factor) {
      any = element_count(op, bytes, n) > 0;
    }
    DPE_CHECK(any, "--min-bytes ", args.min_bytes, " to --max-bytes ", args.max_bytes, " (factor ", args.factor,
              ") gives ", op, " no row: a row of S bytes holds S / 4 float32 elements",
              is_sliced(op) ? ", a multiple of the " + std::to_string(n) + " members for " + op + " (S >= " +
                                  std::to_string(4 * n) + ")"
                            : std::string(" (S >= 4)"),
              "; raise --max-bytes");
  }
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast" || op == "reduce") return 1.0;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter, all_to_all
}

// One member's buffers for one size. S = size bytes; count per member as in nccl-tests.
struct Buffers {
  Tensor tensor;              // all_reduce / broadcast / reduce: S bytes
  Tensor flat;                // all_gather output / reduce_scatter input: S bytes
  Tensor piece;               // all_gather input / reduce_scatter output: S / n bytes
  std::vector<Tensor> pieces_in, pieces_out;  // all_to_all: n pieces of S / n bytes each
};

// `rank`: the member's global rank (its inputs hold rank + 1).
Buffers make_buffers(const std::string& op, int64_t count, int n, int rank, const Device& d) {
  Buffers b;
  double v = rank + 1;
  if (op == "all_reduce" || op == "broadcast" || op == "reduce") {
    b.tensor = full({count}, v, d);
  } else if (op == "all_gather" || op == "reduce_scatter") {
    b.flat = full({count}, v, d);
    b.piece = full({count / n}, v, d);
  } else {
    for (int k = 0; k < n; ++k) {
      b.pieces_in.push_back(full({count / n}, v, d));
      b.pieces_out.push_back(zeros({count / n}, d));
    }
  }
  return b;
}

void run_op(ProcessGroup& group, const std::string& op, int rank, Buffers& b) {
  if (op == "all_reduce") group.all_reduce(rank, b.tensor);
  else if (op == "broadcast") group.broadcast(rank, b.tensor, 0);
  else if (op == "reduce") group.reduce(rank, b.tensor, 0);
  else if (op == "all_gather") group.all_gather_into_tensor(rank, b.flat, b.piece);
  else if (op == "reduce_scatter") group.reduce_scatter_tensor(rank, b.piece, b.flat);
  else group.all_to_all(rank, b.pieces_out, b.pieces_in);
}

// Elements of member `rank`'s result that differ from the expected values after one call on fresh buffers
// (member r's inputs hold r + 1).
int64_t count_wrong(const std::string& op, int n, int rank, const Buffers& b) {
  auto mismatches = [](const Tensor& t, auto expected_at) {
    std::vector<double> v = t.to_vector<double>();
    int64_t wrong = 0;
    for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != expected_at(i);
    return wrong;
  };
  double sum = n * (n + 1) / 2.0;
  if (op == "all_reduce") return mismatches(b.tensor, [&](size_t) { return sum; });
  if (op == "broadcast") return mismatches(b.tensor, [](size_t) { return 1.0; });
  if (op == "reduce") return mismatches(b.tensor, [&](size_t) { return rank == 0 ? sum : rank + 1.0; });
  if (op == "all_gather") {
    size_t per = static_cast<size_t>(b.piece.numel());
    return mismatches(b.flat, [&](size_t i) { return per == 0 ? 0.0 : static_cast<double>(i / per + 1); });
  }
  if (op == "reduce_scatter") return mismatches(b.piece, [&](size_t) { return sum; });
  int64_t wrong = 0;
  for (int k = 0; k < n; ++k) wrong += mismatches(b.pieces_out[k], [&](size_t) { return k + 1.0; });
  return wrong;
}

// STREAM triad a = b + s c over `threads` threads; best of 5; GB/s (1e9) counting 3 arrays of doubles.
double stream_triad_gbs(int threads) {
  const size_t n = 32u << 20;  // 3 x 256 MiB: far beyond the caches
  std::vector<double> a(n), b(n, 1.0), c(n, 2.0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0 * c[i];
      });
    }
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 3.0 * 8.0 * static_cast<double>(n) / s / 1e9);
  }
  return best;
}

CollectiveBackend parse_backend(const std::string& s) {
  if (s == "mpi") return CollectiveBackend::Mpi;
  if (s == "cpu") return CollectiveBackend::Cpu;
  if (s == "peer-copy") return CollectiveBackend::PeerCopy;
  if (s == "nccl") return CollectiveBackend::Nccl;
  return CollectiveBackend::Auto;
}

void run_collectives(CollectivesArgs args) {
  std::vector<Device> devices =
      args.device_ids ? parse_device_option("--device-ids", *args.device_ids) : default_devices(2);
  check_device_ids("--device-ids", devices);
  const std::optional<CollectiveBackend> dist = dist_backend(args.dist, devices);
  const bool across_processes = dist.has_value();
  if (across_processes) {
    DPE_CHECK(args.backend == "auto", "--backend ", args.backend, " cannot be combined with --dist ", args.dist,
              "; expected --backend auto (the --dist backend carries every collective across processes)");
  } else {
    check_sizes(args, static_cast<int>(devices.size()));
  }
  if (!args.json.empty()) args.json = check_output_file("--json", args.json);
  ProcessGroup group(devices, {.backend = dist.value_or(parse_backend(args.backend))});
  // Every figure is over the whole group (every member of every process); process 0 prints.
  const int n = group.world_size(), local = group.size();
  if (across_processes) check_sizes(args, n);
  const bool prints = group.global_rank(0) == 0;
  DeviceWorkerPool pool(devices);
  if (prints) {
    const std::string where = n > local ? " in each of " + std::to_string(n / local) + " processes" : "";
    std::printf("# dpe collectives: %d members (%s%s), backend %s, float32, %d iterations after %d warm-up, GB = 1e9\n",
                n, device_list_str(devices).c_str(), where.c_str(), backend_name(group.backend()), args.iters,
                args.warmup);
    std::printf("# %-15s %10s %12s %11s %11s %11s %7s\n", "collective", "size", "count", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "#wrong");
  }
  JsonReport report = {{"members", n}, {"processes", n / local}, {"backend", backend_name(group.backend())},
                       {"results", JsonReport::array()}};
  const DisposeOnExit dispose_report(report);  // Note [A report's destructor allocates] (json_report.h)
  double largest_allreduce_algbw = 0;
  int64_t largest_allreduce_bytes = 0;
  for (const std::string& op : args.ops) {
    for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= args.factor) {
      const int64_t count = element_count(op, bytes, n);
      if (count == 0) continue;
      // Summed over every member of the group (all-reduced below, the same on every member; member 0 keeps it).
      double seconds = 0;
      int64_t total_wrong = 0;
      // A member that throws aborts the group at once, so the others stop waiting in their collective (they
      // would otherwise wait out the group's timeout, minutes) and the command fails with the first cause.
      std::mutex failure_mutex;
      std::string first_failure;
      auto member = [&](size_t r) {
        const int rank = static_cast<int>(r), global = group.global_rank(rank);
        if (global == args.fail_rank) throw Error("failure injected by --inject-failure-rank for the tests");
        Buffers b = make_buffers(op, count, n, global, devices[r]);
        for (int i = 0; i < args.warmup; ++i) run_op(group, op, rank, b);
        group.barrier(rank);
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < args.iters; ++i) run_op(group, op, rank, b);
        synchronize(devices[r]);
        const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / args.iters;
        Buffers fresh = make_buffers(op, count, n, global, devices[r]);
        run_op(group, op, rank, fresh);
        synchronize(devices[r]);
        Tensor totals = Tensor::from_vector(std::vector<double>{mine, static_cast<double>(count_wrong(op, n, global, fresh))},
                                            {2}, TensorOptions(DType::Float64).with_device(devices[r]));
        group.all_reduce(rank, totals);
        if (rank == 0) {
          const std::vector<double> summed = totals.to_vector<double>();
          seconds = summed[0];
          total_wrong = static_cast<int64_t>(summed[1]);
        }
      };
      try {
        pool.run(local, [&](size_t r) {
          try {
            member(r);
          } catch (const std::exception& e) {
            {
              std::lock_guard<std::mutex> lock(failure_mutex);
              if (first_failure.empty()) {
                first_failure = op + " member " + std::to_string(r) + " on " + devices[r].str() + ": " + e.what();
              }
            }
            group.abort(first_failure);
            throw;
          }
        });
      } catch (const Error&) {
        // The pool reports one member's error, which may be a partner's "aborted" consequence; the cause is
        // the first failure recorded above.
        std::lock_guard<std::mutex> lock(failure_mutex);
        DPE_CHECK(first_failure.empty(), first_failure);
        throw;
      }
      const double t = seconds / n;  // the mean over every member
      if (!prints) continue;
      double size = static_cast<double>(count) * 4;
      double algbw = size / t / 1e9, busbw = algbw * bus_factor(op, n);
      std::printf("  %-15s %10s %12lld %11.1f %11.2f %11.2f %7lld\n", op.c_str(), bytes_str(size).c_str(),
                  static_cast<long long>(count), t * 1e6, algbw, busbw, static_cast<long long>(total_wrong));
      std::fflush(stdout);
      if (op == "all_reduce" && count * 4 >= largest_allreduce_bytes) {
        largest_allreduce_bytes = count * 4;
        largest_allreduce_algbw = algbw;
      }
      report["results"].push_back({{"op", op},
                                   {"bytes", count * 4},
                                   {"count", count},
                                   {"time_us", as_printed("%.3f", t * 1e6)},
                                   {"algbw_gbs", as_printed("%.4f", algbw)},
                                   {"busbw_gbs", as_printed("%.4f", busbw)},
                                   {"wrong", total_wrong}});
    }
  }
  if (!prints) return;
  if (args.stream) {
    // A thread per CPU this process may run on (its affinity mask, as mpirun's --bind-to or taskset set it).
    const int threads = usable_cores();
    double gbs = stream_triad_gbs(threads);
    double limit = gbs / 4.0;
    std::printf("# host memory bandwidth (STREAM triad, %d threads): %.2f GB/s\n", threads, gbs);
    if (largest_allreduce_bytes > 0 && devices[0].is_cpu()) {
      std::printf("# all_reduce %s: %.2f GB/s algbw = %.0f%% of the memory-bandwidth limit %.2f GB/s "
                  "(STREAM / 4 bytes moved per byte reduced)\n",
                  bytes_str(static_cast<double>(largest_allreduce_bytes)).c_str(), largest_allreduce_algbw,
                  100.0 * largest_allreduce_algbw / limit, limit);
    }
    report["stream_triad_gbs"] = as_printed("%.4f", gbs);
  }
  if (!args.json.empty()) write_json_report("--json", args.json, report);
}

}  // namespace

void add_collectives_command(CLI::App& app) {
  auto args = std::make_shared<CollectivesArgs>();
  CLI::App* cmd = app.add_subcommand("collectives", "Bandwidth of the process group's collectives (nccl-tests style)");
  cmd->add_option("--device-ids", args->device_ids, "members, e.g. cpu:0,cpu:1 (default: every CUDA device, else cpu:0,cpu:1)");
  cmd->add_option("--backend", args->backend, "collectives backend")
      ->check(CLI::IsMember({"auto", "cpu", "peer-copy", "nccl"}));
  add_dist_option(*cmd, args->dist, "one group over the devices of every process of an MPI launch; process 0 prints");
  add_name_list_option(*cmd, "--ops", args->ops, "collectives to run",
                       {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"});
  add_int_option(*cmd, "-b,--min-bytes", args->min_bytes,
                 "smallest size in bytes (K, M, G suffixes: powers of 1024); a row holds size / 4 float32 elements",
                 1, int64_t{1} << 32, true);
  add_int_option(*cmd, "-e,--max-bytes", args->max_bytes, "largest size in bytes", 1, int64_t{1} << 32, true);
  add_int_option(*cmd, "-f,--factor", args->factor, "size multiplier between rows", 2, 1024);
  add_int_option(*cmd, "-n,--iters", args->iters, "timed iterations per size", 1, 1000000);
  add_int_option(*cmd, "-w,--warmup", args->warmup, "untimed iterations per size", 0, 1000000);
  cmd->add_flag("--stream", args->stream, "also measure host memory bandwidth and the all-reduce's share of it");
  add_path_option(*cmd, "--json", args->json, "write the results as JSON to this file (checked at start-up)");
  // Tests only, hidden from --help: member RANK throws before its first collective, so that a test can show
  // the others are released at once (ProcessGroup::abort) instead of waiting out the group's timeout.
  add_int_option(*cmd, "--inject-failure-rank", args->fail_rank, "", 0, 1023)->group("");
  cmd->callback([args] {
    run_collectives(*args);
  });
}

}  // namespace dpe::tool
