// What DataParallel does when its replicas span the processes of an MPI launch (backend 'mpi',
// docs/SCALE_OUT.md): the structure check both modes run before the first broadcast, and DP mode's group of
// masters (one per process), whose gradients are averaged after each backward.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd/grad_mode.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/ops.h"
#include "engine/data_parallel.h"
#include "engine/timing.h"

namespace dpe {

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A string as an int64 tensor of one character per element, `length` long (cut or padded with zeros).
Tensor text_tensor(const std::string& text, int64_t length, Device device) {
  std::vector<int64_t> chars(static_cast<size_t>(length), 0);
  for (size_t i = 0; i < text.size() && i < chars.size(); ++i) chars[i] = static_cast<unsigned char>(text[i]);
  return Tensor::from_vector(chars, {length}, TensorOptions(DType::Int64).with_device(device));
}

std::string text_of(const Tensor& t) {
  std::string text;
  for (int64_t c : t.to_vector<int64_t>()) {
    if (c == 0) break;
    text.push_back(static_cast<char>(c));
  }
  return text;
}

}  // namespace

// PyTorch's _verify_param_shape_across_processes, naming what differs: process 0's entry count and per-entry
// fingerprints are broadcast, every process finds its first differing entry, an all-reduce (min) agrees on the
// first (entry, rank) of all, and both processes' descriptions of that entry are broadcast so that every
// process throws the same message, before the parameter broadcast moves any mismatched bytes. Every member of
// every process runs the same collectives on its own copies.
void DataParallel::verify_structure_across_processes(ProcessGroup& group) {
  std::vector<std::string> entries;
  for (size_t k = 0; k < state_names_.size(); ++k) {
    const Tensor& t = replica_state_[0][k];
    entries.push_back(detail::str_cat("'", state_names_[k], "' ", t.dtype(), " ", shape_str(t.shape()),
                                      t.requires_grad() ? "" : " (no grad)"));
  }
  const int64_t count = static_cast<int64_t>(entries.size());
  const int64_t world = group.world_size();
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  constexpr int64_t kTextLength = 256;
  const size_t members = static_cast<size_t>(group.size());
  std::vector<int64_t> first(members, kNone);
  std::vector<std::string> theirs(members), ours(members);
  run_members(group, [&](size_t r) {
    const int rank = static_cast<int>(r);
    const auto on_device = TensorOptions(DType::Int64).with_device(device_ids_[r]);
    Tensor count0 = Tensor::from_vector(std::vector<int64_t>{count}, {1}, on_device);
    group.broadcast(rank, count0, 0);
    const int64_t n0 = count0.to_vector<int64_t>()[0];
    std::vector<int64_t> mine(static_cast<size_t>(n0), 0);
    for (int64_t k = 0; k < std::min(n0, count); ++k) mine[k] = static_cast<int64_t>(fnv1a(entries[k]));
    Tensor hashes0 = Tensor::from_vector(mine, {n0}, on_device);
    group.broadcast(rank, hashes0, 0);
    const std::vector<int64_t> reference = hashes0.to_vector<int64_t>();
    int64_t differs = std::min(n0, count) < std::max(n0, count) ? std::min(n0, count) : kNone;
    for (int64_t k = 0; k < std::min(n0, count); ++k) {
      if (reference[k] != mine[k]) {
        differs = k;
        break;
      }
    }
    Tensor key = Tensor::from_vector(std::vector<int64_t>{differs == kNone ? kNone : differs * world + group.global_rank(rank)},
                                     {1}, on_device);
    group.all_reduce(rank, key, ReduceOp::Min);
    first[r] = key.to_vector<int64_t>()[0];
    if (first[r] == kNone) return;
    const int64_t entry = first[r] / world;
    const int root = static_cast<int>(first[r] % world);
    const std::string described = entry < count ? entries[entry] : detail::str_cat("nothing (", count, " entries)");
    Tensor text0 = text_tensor(described, kTextLength, device_ids_[r]);
    Tensor text_root = text_tensor(described, kTextLength, device_ids_[r]);
    group.broadcast(rank, text0, 0);
    group.broadcast(rank, text_root, root);
    ours[r] = text_of(text0);
    theirs[r] = text_of(text_root);
  });
  if (first[0] == kNone) return;
  const int64_t entry = first[0] / world;
  const int process = static_cast<int>(first[0] % world) / group.size();
  DPE_CHECK(false, options_.mode == ParallelMode::DDP ? "DDP" : "DP", " across processes: process ", process, "'s model differs from process 0's at state entry ",
            entry, ": ", ours[0], " in process 0, ", theirs[0], " in process ", process,
            "; every process must build the same model");
}

void DataParallel::run_members(ProcessGroup& group, const std::function<void(size_t)>& fn) {
  if (&group == group_.get()) return run_replicas(fn);
  DPE_INTERNAL_ASSERT(group.size() == 1, "the masters' group has one member per process, got ", group.size());
  fn(0);  // the masters' group: this process's member is the master, driven from the caller's thread
}

void DataParallel::init_dp_across_processes() {
  masters_ = std::make_shared<ProcessGroup>(std::vector<Device>{device_ids_[0]},
                                            ProcessGroupOptions{options_.backend, options_.timeout});
  verify_structure_across_processes(*masters_);
  NoGradGuard no_grad;
  for (const Tensor& t : replica_state_[0]) masters_->broadcast(0, t, 0);  // process 0's master to all
}

void DataParallel::broadcast_master_buffers() {
  NoGradGuard no_grad;
  for (const Tensor& b : replica_buffers_[0]) masters_->broadcast(0, b, 0);
}

namespace {

// `values`, summed over every member of every process of `group` (member `rank`'s part).
std::vector<double> sum_over_processes(ProcessGroup& group, int rank, const std::vector<double>& values) {
  Tensor sums = Tensor::from_vector(values, {static_cast<int64_t>(values.size())},
                                    TensorOptions(DType::Float64).with_device(group.devices()[rank]));
  group.all_reduce(rank, sums);
  return sums.to_vector<double>();
}

}  // namespace

double DataParallel::average_masters(double loss, int64_t batch) {
  auto start = detail::Clock::now();
  NoGradGuard no_grad;
  const std::vector<double> totals = sum_over_processes(*masters_, 0, {loss * static_cast<double>(batch),
                                                                       static_cast<double>(batch)});
  // Each master's gradient is its batch's mean: weighted by its share of the global batch, the sum is the
  // global batch's mean (for equal batches the weight is 1 / processes, the plain average).
  const double weight = static_cast<double>(batch) / totals[1];
  for (size_t k = 0; k < replica_params_[0].size(); ++k) {
    if (!trainable_[k]) continue;
    const Tensor& param = replica_params_[0][k];
    // A parameter no process used has no gradient; every process must still take part.
    if (!param.grad().defined() || !param.grad().is_contiguous()) {
      param.set_grad(param.grad().defined() ? param.grad().contiguous() : zeros_like(param));
    }
    scale_into(param.grad(), weight);
    masters_->all_reduce(0, param.grad());
    report_.reduce.bytes += static_cast<int64_t>(param.grad().nbytes());
  }
  report_.reduce_ms += detail::ms_since(start);
  return totals[0] / totals[1];
}

double DataParallel::loss_over_processes(ProcessGroup& group, int rank, double loss, int64_t samples) {
  const std::vector<double> totals = sum_over_processes(group, rank, {loss * static_cast<double>(samples),
                                                                      static_cast<double>(samples)});
  return totals[0] / totals[1];
}

double DataParallel::samples_over_processes(ProcessGroup& group, int rank, int64_t samples) {
  return sum_over_processes(group, rank, {static_cast<double>(samples)})[0];
}

bool DataParallel::any_over_processes(ProcessGroup& group, int rank, bool flag) {
  Tensor value = Tensor::from_vector(std::vector<float>{flag ? 1.0f : 0.0f}, {1},
                                     TensorOptions(DType::Float32).with_device(group.devices()[rank]));
  group.all_reduce(rank, value, ReduceOp::Max);
  return value.item() != 0.0;
}

}  // namespace dpe
