#include "collectives/process_group.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "collectives/backend.h"
#include "collectives/backend_registry.h"
#include "collectives/mpi_world.h"
#include "core/autograd/grad_mode.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/lost_thread.h"

namespace dpe {

namespace {

const std::vector<Device>& checked_members(const std::vector<Device>& devices) {
  DPE_CHECK(!devices.empty(), "ProcessGroup: no devices; expected at least one");
  return devices;
}

using collectives::flat_slice;

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

// `members`: the group's world size (every member of every process it spans).
std::string check_list(const std::vector<Device>& devices, size_t k, const std::vector<Tensor>& list,
                       const Device& expected, const char* what, int members) {
  if (list.size() != static_cast<size_t>(members)) {
    return detail::str_cat(member(devices, k), " passed ", list.size(), " ", what, "; expected one per member (",
                           members, ")");
  }
  for (const Tensor& t : list) {
    if (std::string e = check_tensor(devices, k, t, expected, what); !e.empty()) return e;
  }
  return "";
}

}  // namespace

ProcessGroup::ProcessGroup(std::vector<Device> devices, ProcessGroupOptions options)
    : ProcessGroup(std::move(devices), options, nullptr) {}

ProcessGroup::ProcessGroup(std::vector<Device> devices, ProcessGroupOptions options,
                           std::unique_ptr<collectives::Backend> backend)
    : devices_(std::move(devices)),
      backend_(options.backend),
      rendezvous_(checked_members(devices_), options.timeout),
      posted_(devices_.size(), nullptr),
      owned_(devices_.size()),
      sequence_(devices_.size(), 0) {
  std::set<Device> seen;
  for (const Device& d : devices_) {
    DPE_CHECK(d.kind == devices_[0].kind, "ProcessGroup: devices mix ", devices_[0], " and ", d,
              "; all members must be of one kind");
    DPE_CHECK(seen.insert(d).second, "ProcessGroup: ", d, " is listed more than once");
    check_device_exists(d);
  }
  // The backend is chosen here, once (collectives/backend_registry.h); no collective looks at it again.
  backend_ = collectives::resolve_backend(backend_, devices_);
  backend_impl_ = backend ? std::move(backend) : collectives::make_backend(backend_, devices_, options.timeout);
}

std::shared_ptr<ProcessGroup> ProcessGroup::shrink(const std::vector<int>& excluded) {
  DPE_CHECK(world_size() == size(), "ProcessGroup::shrink: the group spans ", world_size() / size(),
            " processes (backend '", backend_name(backend_), "'); only a group within one process can shrink");
  std::vector<int> sorted = excluded;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    DPE_CHECK(sorted[i] >= 0 && sorted[i] < size(), "ProcessGroup::shrink: rank ", sorted[i], " is not one of the ",
              size(), " members");
    DPE_CHECK(i == 0 || sorted[i] != sorted[i - 1], "ProcessGroup::shrink: rank ", sorted[i], " is listed twice");
  }
  DPE_CHECK(sorted.size() < devices_.size(), "ProcessGroup::shrink: excluding ", sorted.size(), " of ", size(),
            " members leaves none");
  std::vector<Device> survivors;
  for (int r = 0; r < size(); ++r) {
    if (!std::binary_search(sorted.begin(), sorted.end(), r)) survivors.push_back(devices_[static_cast<size_t>(r)]);
  }
  std::unique_ptr<collectives::Backend> backend = backend_impl_->shrink(sorted, survivors);
  auto shrunk = std::shared_ptr<ProcessGroup>(
      new ProcessGroup(std::move(survivors), ProcessGroupOptions{backend_, timeout()}, std::move(backend)));
  rendezvous_.abort(detail::str_cat("the group was shrunk to ", shrunk->size(), " members; use the group shrink() "
                                    "returned"));
  return shrunk;
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::abort(const std::string& reason) noexcept {
  // The other processes first: the members woken here fail in turn and abort too, and the first reason
  // announced must be this one, the cause.
  try {
    backend_impl_->abort(reason);
  } catch (...) {
    // Out of memory telling the other processes (their own timeouts end their waits): this process's
    // members must be woken all the same.
  }
  rendezvous_.abort(reason);
}

bool ProcessGroup::reset() noexcept {
  std::lock_guard lock(state_mutex_);
  if (inside_ > 0) return false;  // Note [A member that leaves early]: it stays aborted
  rendezvous_.reset();
  for (size_t r = 0; r < owned_.size(); ++r) {
    posted_[r] = nullptr;
    owned_[r].reset();  // the arguments members left behind on an error: nobody can read them now
  }
  return true;
}

int ProcessGroup::members_inside() const {
  std::lock_guard lock(state_mutex_);
  return inside_;
}

void ProcessGroup::set_work_shares(const std::vector<double>& shares) {
  std::vector<double> normalised;
  if (!shares.empty()) {
    DPE_CHECK(shares.size() == devices_.size(), "ProcessGroup::set_work_shares: ", shares.size(), " shares for ",
              size(), " members");
    double total = 0;
    for (size_t r = 0; r < shares.size(); ++r) {
      DPE_CHECK(std::isfinite(shares[r]) && shares[r] > 0, "ProcessGroup::set_work_shares: share ", shares[r],
                " of member ", r, " (", devices_[r], ") is not a positive finite number");
      total += shares[r];
    }
    for (double w : shares) normalised.push_back(w / total);
  }
  backend_impl_->set_work_shares(normalised);
  work_shares_ = std::move(normalised);
}

bool launched_by_mpi() { return collectives::MpiWorld::launched_by_mpi(); }

int ProcessGroup::world_size() const { return size() * backend_impl_->processes(); }

int ProcessGroup::global_rank(int rank) const { return backend_impl_->process_index() * size() + rank; }

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
  if (mine.root < 0 || mine.root >= world_size()) {
    return detail::str_cat("root ", mine.root, " is out of range for a group of ", world_size(), " members");
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
    if (std::string e = check_list(devices_, k, p.list, devices_[k], name, world_size()); !e.empty()) return e;
    for (const Tensor& t : p.list) {
      if (std::string e = check_like(devices_, k, t, p.tensor, item, relation); !e.empty()) return e;
    }
  }
  return "";
}

std::string ProcessGroup::check_root_list(int root, const char* list_name, const char* name,
                                          const char* relation) const {
  for (size_t k = 0; k < posted_.size(); ++k) {
    if (std::string e = check_tensor(devices_, k, posted_[k]->tensor, devices_[k], name); !e.empty()) return e;
  }
  // The root's list is read in the root's process only (the others pass {}). Its entry for global rank g is
  // compared with this process's member g % size(): the same member in the root's process; in another process,
  // the member at the same place, whose size the backend's own check compares across processes.
  if (root / size() != backend_impl_->process_index()) return "";
  const size_t root_member = local_member(root);
  const std::vector<Tensor>& list = posted_[root_member]->list;
  if (std::string e = check_list(devices_, root_member, list, devices_[root_member], list_name, world_size()); !e.empty()) {
    return e;
  }
  const std::string article_name = detail::str_cat("an ", name);
  for (size_t g = 0; g < list.size(); ++g) {
    const size_t k = g % posted_.size();
    const std::string root_relation = g / posted_.size() == static_cast<size_t>(backend_impl_->process_index())
                                          ? std::string(relation)
                                          : detail::str_cat(relation, " at global rank ", g);
    if (std::string e = check_like(devices_, k, posted_[k]->tensor, list[g], article_name.c_str(), root_relation.c_str());
        !e.empty()) {
      return e;
    }
  }
  return "";
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
  if (flat.numel() != piece.numel() * world_size() || !flat.is_contiguous()) {
    fail_alone(detail::str_cat(what, ": ", member(devices_, rank), " passed an ", flat_name, " of ", flat.numel(),
                               " elements; expected ", world_size(), " x ", piece.numel(), ", contiguous"));
  }
}

// Note [A member that leaves early]
// A collective is two meetings (collectives/rendezvous.h); between them every member reads the others' posted
// arguments and may write their buffers, and normally none leaves before the second meeting, when all are done.
// But the second meeting can end in an error on one member while a partner is still between the two: it timed
// out waiting for a slow partner (a millisecond --timeout on a loaded machine), or an abort woke it. That
// member used to return at once, destroying its Posted (then on its stack) and with it the last reference to
// tensors the partner was still reading and writing: ASan's heap-use-after-free in the backend's
// all_reduce_into, SIGSEGV in check_common, heap corruption. An owner that then called reset() made matters
// worse: the slow member went on into the second meeting of a reopened rendezvous and counted as a member of
// the next collective. So:
//  - a member's arguments are a Posted the group owns (owned_[rank], a shared_ptr) from the moment the member
//    posts them; a Posted holds its tensors, so their storage lives as long as it does;
//  - a member that leaves after both meetings succeeded releases its slot (nobody reads it any more); one that
//    leaves on an error leaves it to the group, which releases it at reset() or at that member's next post;
//  - a member posts only while the group is not aborted (under state_mutex_): every error that ends a meeting
//    early aborts the group, so a member that left early cannot overwrite its slot, nor meet anyone, while a
//    partner is still inside the collective it left;
//  - reset() reopens the group only when no member is inside a call (inside_ counts them); otherwise the
//    group stays aborted for good.
// A worker declared lost and left behind (engine/worker_pool.h, Note [Lost workers]) may stay inside for good:
// its group is never reset again, and its owner, who keeps it alive, builds a new one (DdpStep::replica_dropped, engine/ddp_step.cc).
// The calls are also lost-thread checkpoints (core/lost_thread.h): on entry (before reading the caller's
// arguments), after the first meeting (before writing into the others' buffers) and after the second (before
// returning into the caller), a worker declared lost parks instead of going on.
class ProcessGroup::Inside {
 public:
  Inside(ProcessGroup& group, int rank, std::shared_ptr<const Posted> mine) : group_(group), rank_(rank) {
    std::lock_guard lock(group_.state_mutex_);
    group_.rendezvous_.check_open();  // aborted: a partner may still read this member's slot
    group_.posted_[static_cast<size_t>(rank)] = mine.get();
    group_.owned_[static_cast<size_t>(rank)] = std::move(mine);
    ++group_.inside_;
  }
  ~Inside() {
    std::shared_ptr<const Posted> released;  // destroyed after the lock is released
    std::lock_guard lock(group_.state_mutex_);
    --group_.inside_;
    if (!met_) return;
    group_.posted_[static_cast<size_t>(rank_)] = nullptr;
    released = std::move(group_.owned_[static_cast<size_t>(rank_)]);
  }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;
  // Both meetings succeeded: every member is done with this member's arguments.
  void met() { met_ = true; }

 private:
  ProcessGroup& group_;
  int rank_;
  bool met_ = false;
};

template <typename Validate, typename Work>
void ProcessGroup::run(int rank, std::shared_ptr<const Posted> mine, const Validate& validate, const Work& work) {
  const Collective kind = mine->kind;
  check_rank(rank, collective_name(kind));
  if (kind == injected_kind_ && injected_rank_.load() == rank) {
    injected_rank_.store(-1);
    DPE_CHECK(false, "failure injected into ", collective_name(kind), " on member ", rank);
  }
  NoGradGuard no_grad;
  std::string what = detail::str_cat(collective_name(kind), " #", ++sequence_[rank]);
  checkpoint_if_lost();
  std::string error;
  std::exception_ptr failure;
  bool refused_across_processes = false;
  {
    const Posted& me = *mine;  // alive until `inside` ends
    Inside inside(*this, rank, std::move(mine));
    rendezvous_.meet(rank, what);
    checkpoint_if_lost();  // before touching the others' arguments and buffers
    if (kind == stall_kind_ && stall_rank_.load() == rank) {
      stall_rank_.store(-1);
      std::function<void()> stall = std::move(stall_);
      stall();
    }
    // Every member checks every member's arguments, so a bad argument fails on all of them alike.
    error = check_common(me);
    if (error.empty()) error = validate();
    if (error.empty()) {
      try {
        work();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    // An error in arguments only this process sees leaves the other processes' members waiting for it inside
    // the backend: tell them (they throw "rank p failed: <it>"), and end the group here too, as there.
    refused_across_processes = !error.empty() && backend_impl_->processes() > 1;
    if (refused_across_processes && rank == 0) backend_impl_->abort(detail::str_cat_or_empty(what, ": ", error));
    rendezvous_.meet(rank, what);  // nobody touches another member's buffers past this point
    inside.met();
  }
  checkpoint_if_lost();  // before returning into a caller that may be gone
  if (refused_across_processes && rank == 0) rendezvous_.abort(detail::str_cat_or_empty(what, ": ", error));
  DPE_CHECK(error.empty(), what, ": ", error);
  if (failure) std::rethrow_exception(failure);
  if (rank == 0) calls_[static_cast<size_t>(kind)].fetch_add(1);
}

namespace {

std::shared_ptr<const collectives::Posted> post(collectives::Posted arguments) {
  return std::make_shared<const collectives::Posted>(std::move(arguments));
}

}  // namespace

void ProcessGroup::all_reduce(int rank, const Tensor& tensor, ReduceOp op) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::AllReduce, .op = op, .tensor = tensor});
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", 0); };
  run(rank, std::move(mine), validate, [&] { backend_impl_->all_reduce(rank, posted_); });
}

void ProcessGroup::check_pieces(int rank, const Tensor& output, const std::vector<Tensor>& inputs, double scale) {
  check_rank(rank, "all_reduce_into");
  const auto k = static_cast<size_t>(rank);
  const Device& device = devices_[k];
  auto refuse = [&](const std::string& why) { fail_alone(detail::str_cat("all_reduce_into: ", why)); };
  if (std::string e = check_tensor(devices_, k, output, device, "output"); !e.empty()) refuse(e);
  if (!std::isfinite(scale)) {
    refuse(detail::str_cat(member(devices_, k), " passed scale ", scale, "; expected a finite number"));
  }
  const size_t bytes = element_size(output.dtype());
  const auto* out_begin = static_cast<const char*>(output.data_ptr());
  const auto* out_end = out_begin + output.numel() * static_cast<int64_t>(bytes);
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& piece = inputs[i];
    const std::string what = detail::str_cat("input ", i);
    if (std::string e = check_tensor(devices_, k, piece, device, what.c_str()); !e.empty()) refuse(e);
    if (piece.dtype() != output.dtype()) {
      refuse(detail::str_cat(member(devices_, k), " passed ", what, " of ", piece.dtype(), " for an output of ",
                             output.dtype(), "; expected the same dtype"));
    }
    const auto* at = static_cast<const char*>(piece.data_ptr());
    if (piece.numel() > 0 && at < out_end && at + piece.numel() * static_cast<int64_t>(bytes) > out_begin &&
        at != out_begin + offset * static_cast<int64_t>(bytes)) {
      refuse(detail::str_cat(member(devices_, k), " passed ", what, " overlapping the output away from its own "
                             "place (elements ", offset, "...); a piece may only be the output's slice at its place"));
    }
    offset += piece.numel();
  }
  if (offset != output.numel()) {
    refuse(detail::str_cat(member(devices_, k), " passed ", inputs.size(), " inputs of ", offset,
                           " elements in all for an output of ", output.numel(), "; expected the same count"));
  }
}

void ProcessGroup::all_reduce_into(int rank, const Tensor& output, const std::vector<Tensor>& inputs, double scale) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  check_pieces(rank, output, inputs, scale);
  const bool in_place = backend_impl_->reduces_pieces_in_place(output.dtype());
  if (!in_place) {
    // The pieces go into the output before the members meet, so each member reduces finished outputs.
    NoGradGuard no_grad;
    try {
      int64_t offset = 0;
      for (const Tensor& piece : inputs) {
        scaled_copy_into(flat_slice(output, offset, offset + piece.numel()), piece.view({-1}), scale);
        offset += piece.numel();
      }
    } catch (const std::exception& e) {
      fail_alone(detail::str_cat("all_reduce_into: ", member(devices_, rank), " could not copy its inputs: ", e.what()));
    }
  }
  auto mine = post(Posted{.kind = Collective::AllReduceInto, .tensor = output,
                          .list = in_place ? inputs : std::vector<Tensor>{}, .scale = scale});
  auto validate = [&]() -> std::string {
    if (std::string e = check_every(&Posted::tensor, "output", 0); !e.empty() || !in_place) return e;
    // Every member's pieces line up with member 0's (the backend reduces them piece by piece).
    for (size_t k = 1; k < posted_.size(); ++k) {
      const std::vector<Tensor>& theirs = posted_[k]->list;
      const std::vector<Tensor>& first = posted_[0]->list;
      if (theirs.size() != first.size()) {
        return detail::str_cat(member(devices_, k), " passed ", theirs.size(), " inputs but ", member(devices_, 0),
                               " passed ", first.size(), "; expected the same pieces on every member");
      }
      for (size_t i = 0; i < first.size(); ++i) {
        if (theirs[i].numel() != first[i].numel()) {
          return detail::str_cat(member(devices_, k), " passed input ", i, " of ", theirs[i].numel(), " elements but ",
                                 member(devices_, 0), "'s has ", first[i].numel(),
                                 "; expected the same pieces on every member");
        }
      }
    }
    return "";
  };
  run(rank, std::move(mine), validate, [&] {
    if (in_place) {
      backend_impl_->all_reduce_into(rank, posted_);
    } else {
      backend_impl_->all_reduce(rank, posted_);
    }
  });
}

void ProcessGroup::broadcast(int rank, const Tensor& tensor, int root) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::Broadcast, .root = root, .tensor = tensor});
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", local_member(root)); };
  run(rank, std::move(mine), validate, [&] { backend_impl_->broadcast(rank, posted_); });
}

void ProcessGroup::reduce(int rank, const Tensor& tensor, int root, ReduceOp op) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::Reduce, .root = root, .op = op, .tensor = tensor});
  auto validate = [&] { return check_every(&Posted::tensor, "tensor", local_member(root)); };
  run(rank, std::move(mine), validate, [&] { backend_impl_->reduce(rank, posted_); });
}

void ProcessGroup::all_gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::AllGather, .tensor = input, .list = outputs});
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "input", 0);
    return e.empty() ? check_every_list("outputs", "an output", "its input") : e;
  };
  run(rank, std::move(mine), validate, [&] { backend_impl_->all_gather(rank, posted_); });
}

void ProcessGroup::all_gather_into_tensor(int rank, const Tensor& output, const Tensor& input) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  check_flat(rank, "all_gather_into_tensor", output, "output", input);
  std::vector<Tensor> outputs;
  for (int k = 0; k < world_size(); ++k) outputs.push_back(flat_slice(output, k * input.numel(), (k + 1) * input.numel()));
  // A backend without a flat form gets the list form over the output's slices (validated as lists).
  if (backend_impl_->flat_forms() == collectives::FlatForms::AsLists) return all_gather(rank, outputs, input);
  auto mine = post(Posted{.kind = Collective::AllGather, .tensor = input, .flat = output, .list = outputs});
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "input", 0);
    return e.empty() ? check_every(&Posted::flat, "output", 0) : e;
  };
  run(rank, std::move(mine), validate, [&] { backend_impl_->all_gather_into_tensor(rank, posted_); });
}

void ProcessGroup::reduce_scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::ReduceScatter, .op = op, .tensor = output, .list = inputs});
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "output", 0);
    return e.empty() ? check_every_list("inputs", "an input", "its output") : e;
  };
  run(rank, std::move(mine), validate, [&] { backend_impl_->reduce_scatter(rank, posted_); });
}

void ProcessGroup::reduce_scatter_tensor(int rank, const Tensor& output, const Tensor& input, ReduceOp op) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  check_flat(rank, "reduce_scatter_tensor", input, "input", output);
  std::vector<Tensor> inputs;
  for (int k = 0; k < world_size(); ++k) inputs.push_back(flat_slice(input, k * output.numel(), (k + 1) * output.numel()));
  if (backend_impl_->flat_forms() == collectives::FlatForms::AsLists) return reduce_scatter(rank, output, inputs, op);
  auto mine = post(Posted{.kind = Collective::ReduceScatter, .op = op, .tensor = output, .flat = input, .list = inputs});
  auto validate = [&]() -> std::string {
    std::string e = check_every(&Posted::tensor, "output", 0);
    return e.empty() ? check_every(&Posted::flat, "input", 0) : e;
  };
  run(rank, std::move(mine), validate, [&] { backend_impl_->reduce_scatter_tensor(rank, posted_); });
}

void ProcessGroup::gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input, int root) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::Gather, .root = root, .tensor = input, .list = outputs});
  auto validate = [&] { return check_root_list(root, "outputs", "input", "the root's output for it"); };
  run(rank, std::move(mine), validate, [&] { backend_impl_->gather(rank, posted_); });
}

void ProcessGroup::scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::Scatter, .root = root, .tensor = output, .list = inputs});
  auto validate = [&] { return check_root_list(root, "inputs", "output", "the root's input for it"); };
  run(rank, std::move(mine), validate, [&] { backend_impl_->scatter(rank, posted_); });
}

void ProcessGroup::all_to_all(int rank, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::AllToAll, .list = inputs, .list2 = outputs});
  auto validate = [&]() -> std::string {
    for (size_t k = 0; k < posted_.size(); ++k) {
      const Posted& p = *posted_[k];
      if (std::string e = check_list(devices_, k, p.list, devices_[k], "inputs", world_size()); !e.empty()) return e;
      if (std::string e = check_list(devices_, k, p.list2, devices_[k], "outputs", world_size()); !e.empty()) return e;
    }
    // The pairs inside this process (across processes: the backend checks every pair).
    for (size_t k = 0; k < posted_.size(); ++k) {
      for (size_t j = 0; j < posted_.size(); ++j) {
        const Tensor& out = posted_[k]->list2[global_rank(static_cast<int>(j))];
        if (std::string e = check_like(devices_, k, out, posted_[j]->list[global_rank(static_cast<int>(k))], "an output",
                                       detail::str_cat(member(devices_, j), "'s input for it").c_str());
            !e.empty()) {
          return e;
        }
      }
    }
    return "";
  };
  run(rank, std::move(mine), validate, [&] { backend_impl_->all_to_all(rank, posted_); });
}

void ProcessGroup::barrier(int rank) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  auto mine = post(Posted{.kind = Collective::Barrier});
  run(rank, std::move(mine), [] { return std::string(); }, [&] { backend_impl_->barrier(rank); });
}

std::vector<uint8_t> ProcessGroup::broadcast_object(int rank, const std::vector<uint8_t>& bytes, int root) {
  checkpoint_if_lost();  // Note [A member that leaves early]: before this call reads its arguments
  // Only the root's bytes are read, and the group keeps them past this call (a copy).
  auto mine = post(Posted{.kind = Collective::BroadcastObject, .root = root,
                          .bytes = global_rank(rank) == root ? bytes : std::vector<uint8_t>{}});
  std::vector<uint8_t> result;
  run(rank, std::move(mine), [] { return std::string(); }, [&] { result = backend_impl_->broadcast_object(rank, posted_); });
  return result;
}

}  // namespace dpe
