#include "scatter_gather/process_group.h"

#include <set>

#include "core/autograd/grad_mode.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/ops.h"

#if DPE_WITH_CUDA
#include "core/cuda/cuda_device.h"
#include "scatter_gather/nccl_comms.h"
#else
namespace dpe {
class NcclComms {};
}  // namespace dpe
#endif

namespace dpe {

const char* backend_name(CollectiveBackend backend) {
  switch (backend) {
    case CollectiveBackend::Auto: return "auto";
    case CollectiveBackend::Cpu: return "cpu";
    case CollectiveBackend::PeerCopy: return "peer-copy";
    case CollectiveBackend::Nccl: return "nccl";
  }
  return "?";
}

const char* collective_name(Collective c) {
  static constexpr const char* kNames[kNumCollectives] = {
      "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
      "gather", "scatter", "all_to_all", "barrier", "broadcast_object"};
  return kNames[static_cast<size_t>(c)];
}

// One member's arguments for the collective in flight; lives on the member's stack for the whole call.
struct ProcessGroup::Posted {
  Collective kind;
  int root = 0;
  ReduceOp op = ReduceOp::Sum;
  Tensor tensor;              // all_reduce/broadcast/reduce: the tensor; all_gather/gather: input;
                              // reduce_scatter/scatter: output
  Tensor flat;                // the tensor forms' other side (all_gather output, reduce_scatter input)
  std::vector<Tensor> list;   // all_gather/gather outputs, reduce_scatter/scatter/all_to_all inputs
  std::vector<Tensor> list2;  // all_to_all outputs
  const std::vector<uint8_t>* bytes = nullptr;
};

namespace {

bool all_distinct_gpus(const std::vector<Device>& devices) {
#if DPE_WITH_CUDA
  std::set<int> physical;
  for (const Device& d : devices) physical.insert(cuda::physical_device(d.index));
  return physical.size() == devices.size();
#else
  (void)devices;
  return false;
#endif
}

const std::vector<Device>& checked_members(const std::vector<Device>& devices) {
  DPE_CHECK(!devices.empty(), "ProcessGroup: no devices; expected at least one");
  return devices;
}

// [begin, end) of the elements member `rank` of `n` works on: equal shares, aligned to 64-byte lines so
// that no two members write one cache line.
std::pair<int64_t, int64_t> share_of(int64_t count, size_t element_bytes, int n, int rank) {
  int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(element_bytes));
  int64_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  int64_t begin = std::min(count, per * rank);
  return {begin, std::min(count, begin + per)};
}

Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) { return t.view({-1}).narrow(0, begin, end - begin); }

std::string member(const std::vector<Device>& devices, size_t k) {
  return detail::str_cat("member ", k, " (", devices[k], ")");
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return detail::str_cat(t.numel(), " ", t.dtype(), " elements on ", t.device());
}

// Why `t`, member k's argument `what`, cannot be used ("" when it can).
std::string check_tensor(const std::vector<Device>& devices, size_t k, const Tensor& t, const Device& expected,
                         const char* what) {
  if (!t.defined()) return detail::str_cat(member(devices, k), " passed an undefined ", what);
  if (t.device() != expected) {
    return detail::str_cat(member(devices, k), " passed ", what, " on ", t.device(), "; expected ", expected);
  }
  if (!t.is_contiguous()) return detail::str_cat(member(devices, k), " passed a non-contiguous ", what);
  return "";
}

std::string check_like(const std::vector<Device>& devices, size_t k, const Tensor& t, const Tensor& reference,
                       const char* what, const char* reference_what) {
  if (t.numel() == reference.numel() && t.dtype() == reference.dtype()) return "";
  return detail::str_cat(member(devices, k), " passed ", what, " of ", describe(t), " but ", reference_what,
                         " has ", describe(reference), "; expected the same count and dtype");
}

std::string check_list(const std::vector<Device>& devices, size_t k, const std::vector<Tensor>& list,
                       const Device& expected, const char* what) {
  if (list.size() != devices.size()) {
    return detail::str_cat(member(devices, k), " passed ", list.size(), " ", what, "; expected one per member (",
                           devices.size(), ")");
  }
  for (const Tensor& t : list) {
    if (std::string e = check_tensor(devices, k, t, expected, what); !e.empty()) return e;
  }
  return "";
}

}  // namespace

ProcessGroup::ProcessGroup(std::vector<Device> devices, ProcessGroupOptions options)
    : devices_(std::move(devices)),
      backend_(options.backend),
      rendezvous_(checked_members(devices_), options.timeout),
      posted_(devices_.size(), nullptr),
      sequence_(devices_.size(), 0) {
  std::set<Device> seen;
  for (const Device& d : devices_) {
    DPE_CHECK(d.kind == devices_[0].kind, "ProcessGroup: devices mix ", devices_[0], " and ", d,
              "; all members must be of one kind");
    DPE_CHECK(seen.insert(d).second, "ProcessGroup: ", d, " is listed more than once");
    check_device_exists(d);
  }
  bool cpu = devices_[0].is_cpu();
  if (backend_ == CollectiveBackend::Auto) {
    backend_ = cpu ? CollectiveBackend::Cpu
                   : (all_distinct_gpus(devices_) ? CollectiveBackend::Nccl : CollectiveBackend::PeerCopy);
  }
  DPE_CHECK(cpu == (backend_ == CollectiveBackend::Cpu), "ProcessGroup: backend '", backend_name(backend_),
            "' cannot serve ", devices_[0], "; expected '", cpu ? "cpu" : "nccl' or 'peer-copy", "'");
  if (backend_ == CollectiveBackend::Nccl) {
    DPE_CHECK(all_distinct_gpus(devices_), "ProcessGroup: backend 'nccl' needs every member on its own GPU "
              "(NCCL refuses one GPU as two ranks); these logical devices share a GPU: use 'peer-copy'");
#if DPE_WITH_CUDA
    std::vector<int> logical;
    for (const Device& d : devices_) logical.push_back(static_cast<int>(d.index));
    nccl_ = std::make_unique<NcclComms>(logical);
#endif
  }
}

ProcessGroup::~ProcessGroup() = default;

int64_t ProcessGroup::total_calls() const {
  int64_t total = 0;
  for (const auto& c : calls_) total += c.load();
  return total;
}

void ProcessGroup::reset_counters() {
  for (auto& c : calls_) c.store(0);
}

std::string ProcessGroup::check_common(const Posted& mine) const {
  for (size_t k = 0; k < posted_.size(); ++k) {
    const Posted& other = *posted_[k];
    if (other.kind != posted_[0]->kind) {
      return detail::str_cat(member(devices_, k), " called ", collective_name(other.kind), " while ",
                             member(devices_, 0), " called ", collective_name(posted_[0]->kind),
                             "; every member must call the same collectives in the same order");
    }
    if (other.root != posted_[0]->root || other.op != posted_[0]->op) {
      return detail::str_cat(member(devices_, k), " passed root ", other.root, " and op ",
                             reduce_op_name(other.op), " but ", member(devices_, 0), " passed root ",
                             posted_[0]->root, " and op ", reduce_op_name(posted_[0]->op));
    }
  }
  if (mine.root < 0 || mine.root >= size()) {
    return detail::str_cat("root ", mine.root, " is out of range for a group of ", size(), " members");
  }
  return "";
}

std::string ProcessGroup::check_every(Tensor Posted::*field, const char* name, size_t reference) const {
  const Tensor& expected = posted_[reference]->*field;
  const std::string article_name = detail::str_cat(std::string("aeiou").find(name[0]) == std::string::npos ? "a " : "an ", name);
  const std::string reference_name = detail::str_cat("member ", reference, "'s");
  for (size_t k = 0; k < posted_.size(); ++k) {
    const Tensor& t = posted_[k]->*field;
    if (std::string e = check_tensor(devices_, k, t, devices_[k], name); !e.empty()) return e;
    if (std::string e = check_like(devices_, k, t, expected, article_name.c_str(), reference_name.c_str()); !e.empty()) {
      return e;
    }
  }
  return "";
}

std::string ProcessGroup::check_every_list(const char* name, const char* item, const char* relation) const {
  for (size_t k = 0; k < posted_.size(); ++k) {
    const Posted& p = *posted_[k];
    if (std::string e = check_list(devices_, k, p.list, devices_[k], name); !e.empty()) return e;
    for (const Tensor& t : p.list) {
      if (std::string e = check_like(devices_, k, t, p.tensor, item, relation); !e.empty()) return e;
    }
  }
  return "";
}

std::string ProcessGroup::check_root_list(size_t root, const char* list_name, const char* name,
                                          const char* relation) const {
  const std::vector<Tensor>& list = posted_[root]->list;
  if (std::string e = check_list(devices_, root, list, devices_[root], list_name); !e.empty()) return e;
  const std::string article_name = detail::str_cat("an ", name);
  for (size_t k = 0; k < posted_.size(); ++k) {
    const Tensor& t = posted_[k]->tensor;
    if (std::string e = check_tensor(devices_, k, t, devices_[k], name); !e.empty()) return e;
    if (std::string e = check_like(devices_, k, t, list[k], article_name.c_str(), relation); !e.empty()) return e;
  }
  return "";
}

std::vector<Tensor> ProcessGroup::share_of_every_tensor(int rank) const {
  const Tensor& mine = posted_[rank]->tensor;  // validated: every member's has this count and dtype
  auto [begin, end] = share_of(mine.numel(), element_size(mine.dtype()), size(), rank);
  std::vector<Tensor> slices;
  if (begin == end) return slices;
  for (const Posted* p : posted_) slices.push_back(flat_slice(p->tensor, begin, end));
  return slices;
}

void ProcessGroup::fail_alone(const std::string& message) {
  rendezvous_.abort(message);
  DPE_CHECK(false, message);
}

void ProcessGroup::check_rank(int rank, const char* what) {
  if (rank < 0 || rank >= size()) {
    fail_alone(detail::str_cat(what, ": rank ", rank, " is out of range for a group of ", size(), " members"));
  }
}

void ProcessGroup::check_flat(int rank, const char* what, const Tensor& flat, const char* flat_name,
                              const Tensor& piece) {
  check_rank(rank, what);
  if (!flat.defined() || !piece.defined()) fail_alone(detail::str_cat(what, ": undefined tensor"));
  if (flat.numel() != piece.numel() * size() || !flat.is_contiguous()) {
    fail_alone(detail::str_cat(what, ": ", member(devices_, rank), " passed an ", flat_name, " of ", flat.numel(),
                               " elements; expected ", size(), " x ", piece.numel(), ", contiguous"));
  }
}

template <typename Validate, typename Work>
void ProcessGroup::run(int rank, Posted& mine, const Validate& validate, const Work& work) {
  check_rank(rank, collective_name(mine.kind));
  NoGradGuard no_grad;
  std::string what = detail::str_cat(collective_name(mine.kind), " #", ++sequence_[rank]);
  posted_[rank] = &mine;
  rendezvous_.meet(rank, what);
  // Every member checks every member's arguments, so a bad argument fails on all of them alike.
  std::string error = check_common(mine);
  if (error.empty()) error = validate();
  std::exception_ptr failure;
  if (error.empty()) {
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  rendezvous_.meet(rank, what);  // nobody touches another member's buffers past this point
  DPE_CHECK(error.empty(), what, ": ", error);
  if (failure) std::rethrow_exception(failure);
  if (rank == 0) calls_[static_cast<size_t>(mine.kind)].fetch_add(1);
}

void ProcessGroup::copy(const Tensor& dst, const Tensor& src) const {
  if (dst.numel() == 0 || (dst.data_ptr() == src.data_ptr() && dst.device() == src.device())) return;
  copy_into(dst.view({-1}), src.view({-1}));
}

void ProcessGroup::combine(int rank, const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs,
                           ReduceOp op) const {
  if (srcs[0].numel() == 0) return;
  if (devices_[rank].is_cpu()) {
    std::vector<const void*> in;
    std::vector<void*> out;
    for (const Tensor& s : srcs) in.push_back(s.data_ptr());
    for (const Tensor& d : dsts) out.push_back(d.data_ptr());
    reduce_buffers_cpu(srcs[0].dtype(), op, in, out, srcs[0].numel());
    return;
  }
  // Peer copies: stage every source on this member's device, reduce there, copy the result out.
  std::vector<Tensor> staged;
  for (const Tensor& s : srcs) staged.push_back(s.to(devices_[rank]).reshape({-1}));
  Tensor stacked = stack(staged, 0);
  Tensor result;
  switch (op) {
    case ReduceOp::Sum: result = sum(stacked, 0); break;
    case ReduceOp::Avg: result = sum(stacked, 0) * (1.0 / static_cast<double>(srcs.size())); break;
    case ReduceOp::Max: result = max(stacked, 0).values; break;
    case ReduceOp::Min: result = neg(max(neg(stacked), 0).values); break;
  }
  for (const Tensor& d : dsts) copy_into(d.view({-1}), result);
}

void ProcessGroup::all_reduce(int rank, const Tensor& tensor, ReduceOp op) {
  Posted mine{.kind = Collective::AllReduce, .op = op, .tensor = tensor};
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", 0); };
  run(rank, mine, validate, [&] {
    if (uses_nccl()) {
#if DPE_WITH_CUDA
      nccl_->all_reduce(rank, tensor, op);
#endif
      return;
    }
    std::vector<Tensor> slices = share_of_every_tensor(rank);
    if (!slices.empty()) combine(rank, slices, slices, op);
  });
}

void ProcessGroup::broadcast(int rank, const Tensor& tensor, int root) {
  Posted mine{.kind = Collective::Broadcast, .root = root, .tensor = tensor};
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", static_cast<size_t>(root)); };
  run(rank, mine, validate, [&] {
    if (uses_nccl()) {
#if DPE_WITH_CUDA
      nccl_->broadcast(rank, tensor, root);
#endif
      return;
    }
    if (rank != root) copy(tensor, posted_[root]->tensor);
  });
}

void ProcessGroup::reduce(int rank, const Tensor& tensor, int root, ReduceOp op) {
  Posted mine{.kind = Collective::Reduce, .root = root, .op = op, .tensor = tensor};
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", static_cast<size_t>(root)); };
  run(rank, mine, validate, [&] {
    if (uses_nccl()) {
#if DPE_WITH_CUDA
      nccl_->reduce(rank, tensor, root, op);
#endif
      return;
    }
    std::vector<Tensor> slices = share_of_every_tensor(rank);
    if (!slices.empty()) combine(rank, {slices[root]}, slices, op);
  });
}

void ProcessGroup::all_gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input) {
  Posted mine{.kind = Collective::AllGather, .tensor = input, .list = outputs};
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "input", 0);
    return e.empty() ? check_every_list("outputs", "an output", "its input") : e;
  };
  run(rank, mine, validate, [&] {
    for (int k = 0; k < size(); ++k) copy(outputs[k], posted_[k]->tensor);
  });
}

void ProcessGroup::all_gather_into_tensor(int rank, const Tensor& output, const Tensor& input) {
  check_flat(rank, "all_gather_into_tensor", output, "output", input);
  std::vector<Tensor> outputs;
  for (int k = 0; k < size(); ++k) outputs.push_back(flat_slice(output, k * input.numel(), (k + 1) * input.numel()));
  if (!uses_nccl()) return all_gather(rank, outputs, input);
#if DPE_WITH_CUDA
  Posted mine{.kind = Collective::AllGather, .tensor = input, .flat = output, .list = outputs};
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "input", 0);
    return e.empty() ? check_every(&Posted::flat, "output", 0) : e;
  };
  run(rank, mine, validate, [&] { nccl_->all_gather(rank, output, input); });
#endif
}

void ProcessGroup::reduce_scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  Posted mine{.kind = Collective::ReduceScatter, .op = op, .tensor = output, .list = inputs};
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "output", 0);
    return e.empty() ? check_every_list("inputs", "an input", "its output") : e;
  };
  run(rank, mine, validate, [&] {
    std::vector<Tensor> mine_from_each;
    for (const Posted* p : posted_) mine_from_each.push_back(p->list[rank]);
    // In place (output is this member's own slice of its input): the kernel reads before it writes.
    combine(rank, {output}, mine_from_each, op);
  });
}

void ProcessGroup::reduce_scatter_tensor(int rank, const Tensor& output, const Tensor& input, ReduceOp op) {
  check_flat(rank, "reduce_scatter_tensor", input, "input", output);
  std::vector<Tensor> inputs;
  for (int k = 0; k < size(); ++k) inputs.push_back(flat_slice(input, k * output.numel(), (k + 1) * output.numel()));
  if (!uses_nccl()) return reduce_scatter(rank, output, inputs, op);
#if DPE_WITH_CUDA
  Posted mine{.kind = Collective::ReduceScatter, .op = op, .tensor = output, .flat = input, .list = inputs};
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "output", 0);
    return e.empty() ? check_every(&Posted::flat, "input", 0) : e;
  };
  run(rank, mine, validate, [&] { nccl_->reduce_scatter(rank, output, input, op); });
#endif
}

void ProcessGroup::gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input, int root) {
  Posted mine{.kind = Collective::Gather, .root = root, .tensor = input, .list = outputs};
  auto validate = [&] { return check_root_list(static_cast<size_t>(root), "outputs", "input", "the root's output for it"); };
  run(rank, mine, validate, [&] { copy(posted_[root]->list[rank], input); });
}

void ProcessGroup::scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  Posted mine{.kind = Collective::Scatter, .root = root, .tensor = output, .list = inputs};
  auto validate = [&] { return check_root_list(static_cast<size_t>(root), "inputs", "output", "the root's input for it"); };
  run(rank, mine, validate, [&] { copy(output, posted_[root]->list[rank]); });
}

void ProcessGroup::all_to_all(int rank, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  Posted mine{.kind = Collective::AllToAll, .list = inputs, .list2 = outputs};
  auto validate = [&]() -> std::string {
    for (size_t k = 0; k < posted_.size(); ++k) {
      const Posted& p = *posted_[k];
      if (std::string e = check_list(devices_, k, p.list, devices_[k], "inputs"); !e.empty()) return e;
      if (std::string e = check_list(devices_, k, p.list2, devices_[k], "outputs"); !e.empty()) return e;
    }
    for (size_t k = 0; k < posted_.size(); ++k) {
      for (size_t j = 0; j < posted_.size(); ++j) {
        const Tensor& out = posted_[k]->list2[j];
        if (std::string e = check_like(devices_, k, out, posted_[j]->list[k], "an output",
                                       detail::str_cat(member(devices_, j), "'s input for it").c_str());
            !e.empty()) {
          return e;
        }
      }
    }
    return "";
  };
  run(rank, mine, validate, [&] {
    for (int k = 0; k < size(); ++k) copy(outputs[k], posted_[k]->list[rank]);
  });
}

void ProcessGroup::barrier(int rank) {
  Posted mine{.kind = Collective::Barrier};
  run(rank, mine, [] { return std::string(); }, [] {});
}

std::vector<uint8_t> ProcessGroup::broadcast_object(int rank, const std::vector<uint8_t>& bytes, int root) {
  Posted mine{.kind = Collective::BroadcastObject, .root = root, .bytes = &bytes};
  std::vector<uint8_t> result;
  run(rank, mine, [] { return std::string(); }, [&] { result = *posted_[root]->bytes; });
  return result;
}

}  // namespace dpe
