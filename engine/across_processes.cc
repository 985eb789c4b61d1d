#include "engine/across_processes.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "engine/timing.h"

namespace dpe {

namespace {

// One line per state entry of replica 0: what must match across processes.
std::vector<std::string> describe_state(const ReplicaSet& replicas) {
  std::vector<std::string> entries;
  for (size_t k = 0; k < replicas.state_names().size(); ++k) {
    const Tensor& t = replicas.state(0)[k];
    entries.push_back(detail::str_cat("'", replicas.state_names()[k], "' ", t.dtype(), " ", shape_str(t.shape()),
                                      t.requires_grad() ? "" : " (no grad)"));
  }
  return entries;
}

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<std::string> lines_of(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> lines;
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string entry_or_nothing(const std::vector<std::string>& entries, int64_t k) {
  return k < static_cast<int64_t>(entries.size()) ? entries[k]
                                                  : detail::str_cat("nothing (", entries.size(), " entries)");
}

// `values`, summed over every member of every process of `group` (member `rank`'s part).
std::vector<double> sum_over_processes(ProcessGroup& group, int rank, const std::vector<double>& values) {
  Tensor sums = Tensor::from_vector(values, {static_cast<int64_t>(values.size())},
                                    TensorOptions(DType::Float64).with_device(group.devices()[rank]));
  group.all_reduce(rank, sums);
  return sums.to_vector<double>();
}

// Process 0's description (one line per entry) is broadcast as one object; every process finds its first
// differing entry, an all-reduce (min) agrees on the first (entry, rank) of all, and that process's line is
// broadcast, so that every process throws the same message before anything else moves. Every member of every
// process runs the same collectives. `what`: "model", "optimizer"; `entry_name`: what one line describes.
void verify_lines_across_processes(ProcessGroup& group, const std::vector<std::string>& entries, const char* who,
                                   const char* what, const char* entry_name, const EachMember& each_member) {
  std::string text;
  for (const std::string& e : entries) text += e + "\n";
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const int64_t world = group.world_size();
  std::vector<int64_t> first(static_cast<size_t>(group.size()), kNone);
  std::vector<std::string> ours(first.size()), theirs(first.size());
  each_member([&](size_t r) {
    const int rank = static_cast<int>(r);
    const std::vector<std::string> reference = lines_of(group.broadcast_object(rank, bytes_of(text), 0));
    const size_t common = std::min(reference.size(), entries.size());
    int64_t differs = reference.size() == entries.size() ? kNone : static_cast<int64_t>(common);
    for (size_t k = 0; k < common; ++k) {
      if (reference[k] != entries[k]) {
        differs = static_cast<int64_t>(k);
        break;
      }
    }
    Tensor key = Tensor::from_vector(
        std::vector<int64_t>{differs == kNone ? kNone : differs * world + group.global_rank(rank)}, {1},
        TensorOptions(DType::Int64).with_device(group.devices()[r]));
    group.all_reduce(rank, key, ReduceOp::Min);
    first[r] = key.to_vector<int64_t>()[0];
    if (first[r] == kNone) return;
    const int64_t entry = first[r] / world;
    const int root = static_cast<int>(first[r] % world);
    ours[r] = entry_or_nothing(reference, entry);
    const std::vector<uint8_t> described = group.broadcast_object(rank, bytes_of(entry_or_nothing(entries, entry)), root);
    theirs[r] = std::string(described.begin(), described.end());
  });
  if (first[0] == kNone) return;
  const int64_t entry = first[0] / world;
  const int process = static_cast<int>(first[0] % world) / group.size();
  DPE_CHECK(false, who, " across processes: process ", process, "'s ", what, " differs from process 0's at ",
            entry_name, " ", entry, ": ", ours[0], " in process 0, ", theirs[0], " in process ", process,
            "; every process must build the same ", what);
}

}  // namespace

void verify_structure_across_processes(ProcessGroup& group, const ReplicaSet& replicas, const char* who,
                                       const EachMember& each_member) {
  verify_lines_across_processes(group, describe_state(replicas), who, "model", "state entry", each_member);
}

// The optimizer's type, then per param group its parameter count, lr and every other hyper-parameter, each the
// shortest text that reads back as the same double (so that any difference shows).
void verify_optimizer_across_processes(ProcessGroup& group, const optim::Optimizer& optimizer, const char* who,
                                       const EachMember& each_member) {
  auto exact = [](double value) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;
    return std::string(text, end);
  };
  std::vector<std::string> entries{"type " + optimizer.type_name()};
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const optim::ParamGroup& params = optimizer.param_groups()[g];
    std::string line = detail::str_cat("param group ", g, ": ", params.params.size(), " parameters, lr ",
                                       exact(params.lr));
    for (const auto& [name, value] : params.options) line += ", " + name + " " + exact(value);
    entries.push_back(line);
  }
  verify_lines_across_processes(group, entries, who, "optimizer", "entry", each_member);
}

double loss_over_processes(ProcessGroup& group, int rank, double loss, int64_t samples) {
  const std::vector<double> totals =
      sum_over_processes(group, rank, {loss * static_cast<double>(samples), static_cast<double>(samples)});
  return totals[0] / totals[1];
}

double samples_over_processes(ProcessGroup& group, int rank, int64_t samples) {
  return sum_over_processes(group, rank, {static_cast<double>(samples)})[0];
}

bool any_over_processes(ProcessGroup& group, int rank, bool flag) {
  Tensor value = Tensor::from_vector(std::vector<float>{flag ? 1.0f : 0.0f}, {1},
                                     TensorOptions(DType::Float32).with_device(group.devices()[rank]));
  group.all_reduce(rank, value, ReduceOp::Max);
  return value.item() != 0.0;
}

MastersSync::MastersSync(ReplicaSet& replicas, const DataParallelOptions& options)
    : replicas_(replicas),
      bucket_bytes_(options.bucket_bytes),
      group_(std::make_shared<ProcessGroup>(std::vector<Device>{replicas.devices()[0]},
                                            ProcessGroupOptions{options.backend, options.timeout})) {
  verify_structure_across_processes(*group_, replicas_, "DP", [](const std::function<void(size_t)>& fn) { fn(0); });
  NoGradGuard no_grad;
  for (const Tensor& t : replicas_.state(0)) group_->broadcast(0, t, 0);  // process 0's master to all
}

void MastersSync::broadcast_buffers() {
  NoGradGuard no_grad;
  for (const Tensor& b : replicas_.buffers(0)) group_->broadcast(0, b, 0);
}

double MastersSync::average(double loss, int64_t batch, StepReport& report) {
  const auto start = detail::Clock::now();
  NoGradGuard no_grad;
  const std::vector<double> totals =
      sum_over_processes(*group_, 0, {loss * static_cast<double>(batch), static_cast<double>(batch)});
  // Each master's gradient is its batch's mean: weighted by its share of the global batch, the sum is the
  // global batch's mean (for equal batches the weight is 1 / processes, the plain average).
  const double weight = static_cast<double>(batch) / totals[1];
  std::vector<Tensor> grads;
  for (size_t k = 0; k < replicas_.params(0).size(); ++k) {
    if (!replicas_.trainable()[k]) continue;
    const Tensor& param = replicas_.params(0)[k];
    // A parameter no process used has no gradient; every process must still take part.
    if (!param.grad().defined() || !param.grad().is_contiguous()) {
      param.set_grad(param.grad().defined() ? param.grad().contiguous() : zeros_like(param));
    }
    grads.push_back(param.grad());
  }
  for (const auto& [first, last] : plan_buckets(grads, bucket_bytes_)) {
    std::vector<Tensor> pieces;
    int64_t count = 0;
    for (size_t i = first; i < last; ++i) {
      pieces.push_back(grads[i].view({-1}));
      count += grads[i].numel();
    }
    Tensor bucket = Tensor::empty({count}, TensorOptions(grads[first].dtype()).with_device(grads[first].device()));
    group_->all_reduce_into(0, bucket, pieces, weight);
    int64_t offset = 0;
    for (Tensor& piece : pieces) {
      piece.copy_(bucket.narrow(0, offset, piece.numel()));
      offset += piece.numel();
    }
    report.reduce.bytes += static_cast<int64_t>(bucket.nbytes());
  }
  report.reduce_ms += detail::ms_since(start);
  return totals[0] / totals[1];
}

}  // namespace dpe
