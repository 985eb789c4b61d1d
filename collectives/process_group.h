// ProcessGroup: collectives among the devices of one process, one member (rank) per device, each member
// driven by its own thread (DDP mode's shape: one persistent worker per device). PyTorch's c10d names and
// semantics, with the rank passed explicitly because every member lives in the same process:
//
//   ProcessGroup group({Device::cpu(0), Device::cpu(1)});
//   pool.run(2, [&](size_t r) { group.all_reduce(r, grads[r], ReduceOp::Avg); });
//
// Backends (docs/PYTORCH_SEMANTICS.md §4), chosen once when the group is constructed
// (collectives/backend.h, internal):
//  - Cpu: CPU devices share the host memory. Every member does its share of the work (an all-reduce
//    reduces 1/n of the elements across all members' buffers and writes the result back into all of them),
//    so a collective runs on n threads near memory bandwidth.
//  - PeerCopy: CUDA logical devices that share a GPU (NCCL refuses one GPU as two ranks). Members pull the
//    slices they own with device-to-device copies and reduce them on their own stream.
//  - Nccl: CUDA devices on distinct GPUs; one communicator per member (ncclCommInitAll), the reducing
//    collectives and broadcast run as NCCL calls on each member's stream; gather/scatter/all_to_all/object
//    broadcasts use peer copies.
//  - Mpi: the devices of every process of an MPI launch (collectives/mpi_backend.h; CUDA tensors cross
//    processes through pinned host memory): the group's members are
//    this process's devices in each of P processes, P x size() in all. Construction is collective across the
//    processes. Every collective.
//  - MpiNccl: CUDA devices of every process of an MPI launch, no two on one GPU (collectives/mpi_nccl_backend.h):
//    one NCCL clique over all of them, bootstrapped over MPI; the reducing collectives, broadcast and the
//    flat forms GPU to GPU through NCCL, the others as Mpi's.
//  Auto picks Cpu for CPU devices, Nccl for CUDA devices on distinct GPUs, PeerCopy otherwise (never one that
//  spans processes).
//
// Contract for every collective:
//  - every member calls the same collectives in the same order, each with its own rank, concurrently;
//  - tensors are contiguous and on the member's own device (gather/scatter lists: on the root's device);
//  - members' arguments must agree (op, root, dtype, sizes): a disagreement throws on every member, with a
//    message naming the member and the values, and leaves the group usable; across processes (backend
//    'mpi', 'mpi-nccl'), arguments that only one process can see are wrong end the group in every process, the others
//    throwing "rank p failed: <the message>";
//  - a member that does not arrive within the timeout is an error naming its device, raised on every member
//    that waits; the group is then aborted (every call throws) until reset();
//  - a call returns when this member's outputs are written (CUDA: ordered before later work on the member's
//    stream) and no other member touches its buffers any more. The exception: a call that fails at its second
//    meeting (a timeout, an abort) returns while a slow partner may still be between the meetings, reading
//    this member's arguments and writing its buffers: the group keeps them alive until that partner has left
//    (Note [A member that leaves early] in process_group.cc), so that is never a use after free; their
//    contents are the failed call's own business.
// In place: all_reduce/broadcast/reduce work on `tensor` itself; all_gather_into_tensor is in place when
// `input` is output's slice `rank`, reduce_scatter_tensor when `output` is input's slice `rank`.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "collectives/collective_types.h"
#include "collectives/rendezvous.h"

namespace dpe {

struct ProcessGroupOptions {
  CollectiveBackend backend = CollectiveBackend::Auto;
  // PyTorch's default is 30 min; an in-process group can tell a hang much sooner.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

namespace collectives {
class Backend;  // collectives/backend.h (internal)
struct Posted;
}  // namespace collectives

// Whether this process was started by an MPI launcher (mpirun, srun --mpi=pmix), without initialising MPI.
bool launched_by_mpi();

class ProcessGroup {
 public:
  // devices: one member per device, rank = position. Throws on an empty list, duplicates, mixed kinds, a
  // device that does not exist, or a backend that cannot serve the devices (naming both).
  explicit ProcessGroup(std::vector<Device> devices, ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<Device>& devices() const { return devices_; }
  CollectiveBackend backend() const { return backend_; }
  // Members across every process the group spans (backends 'mpi' and 'mpi-nccl': processes x size(); else size()), and a
  // member's rank among them (process index x size() + rank). Every process has the same size().
  int world_size() const;
  int global_rank(int rank) const;
  // Every collective's `root` is a global rank, in [0, world_size()).
  std::chrono::milliseconds timeout() const { return rendezvous_.timeout(); }

  void all_reduce(int rank, const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // output = the sum over every member m of scale_m x the concatenation of m's `inputs`, on every member (a
  // weighted all-reduce gathered from pieces: DDP's bucket, engine/ddp_reducer.h). inputs: on the member's
  // device, contiguous, output's dtype, their counts adding up to output's and the same piece by piece on
  // every member; a piece may be output's own slice at its place (in place), no other part of it. scale:
  // finite, this member's own (members may differ). Where the backend can (CPU devices, float32/float64) it
  // reads the pieces where they are, so a gradient enters its bucket without a copy of its own; elsewhere each
  // member copies its scaled pieces into its output first and output is all-reduced. Each product is rounded
  // on its own, then the sum in rank order, as the copy and all_reduce would round them.
  void all_reduce_into(int rank, const Tensor& output, const std::vector<Tensor>& inputs, double scale = 1.0);
  void broadcast(int rank, const Tensor& tensor, int root);
  // The result lands in root's tensor; the other members' tensors are left unchanged.
  void reduce(int rank, const Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum);
  // outputs[k] = the input of the member of global rank k (world_size() outputs; every input the same size
  // and dtype).
  void all_gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input);
  // output: world_size() * input.numel() elements; slice k = the input of the member of global rank k.
  void all_gather_into_tensor(int rank, const Tensor& output, const Tensor& input);
  // output = op over members k of inputs_k[rank].
  void reduce_scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum);
  // input: world_size() * output.numel() elements; output = op over members of their input's slice `rank`.
  void reduce_scatter_tensor(int rank, const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum);
  // Root's outputs[k] = member k's input; `outputs` is read on the root only (others pass {}).
  void gather(int rank, const std::vector<Tensor>& outputs, const Tensor& input, int root);
  // output = root's inputs[rank]; `inputs` is read on the root only.
  void scatter(int rank, const Tensor& output, const std::vector<Tensor>& inputs, int root);
  // outputs[k] = member k's inputs[rank]; sizes may differ per pair but must match pairwise.
  void all_to_all(int rank, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs);
  void barrier(int rank);
  // Root's bytes, returned on every member (PyTorch's broadcast_object_list, with serialization left to
  // the caller).
  std::vector<uint8_t> broadcast_object(int rank, const std::vector<uint8_t>& bytes, int root);

  // How much of each reduction member r does in this process (all_reduce, reduce): shares[r] of the
  // elements, where the backend splits the work among members (the shared-memory backend, which gives every
  // member 1/size() by default; the others ignore it). DDP's auto split sets it to the devices' speed
  // weights, so that a slow device does a smaller part of the all-reduce too. Results are the same for any
  // shares (each element is reduced by one member, over the members in rank order). size() positive finite
  // values (normalised here), or empty for equal shares; anything else throws naming the value. Call between
  // collectives (no member inside one).
  void set_work_shares(const std::vector<double>& shares);
  const std::vector<double>& work_shares() const { return work_shares_; }  // normalised; empty: equal

  // Wakes every member waiting in a collective with an error carrying `reason` (a replica failed and its
  // partners must not wait for it); every collective throws until reset().
  // Backends 'mpi' and 'mpi-nccl': the other processes are told too, and their members' waits end with this reason (every
  // later collective of the group then throws, in every process: reset() cannot bring processes back).
  // Never throws, so that it can run in failure handlers: out of memory, the members are woken all the same
  // (an empty reason, or one that cannot be kept, reads "the reason was lost"); build reasons with
  // detail::str_cat_or_empty for the same reason.
  void abort(const std::string& reason) noexcept;
  // Makes an aborted group usable again, if no member is inside a collective (between entering the call and
  // leaving it), and returns true; otherwise leaves it aborted for good and returns false: a member still
  // inside (slow, or a thread declared lost and left behind: engine/worker_pool.h) would take part in the
  // next collective's meetings. The owner calls it once every member's thread has returned from its last
  // collective; a member that may still come (a lost thread about to enter one) is the owner's to rule out
  // (such a group is replaced, never reset: engine/ddp_step.cc). Never throws.
  bool reset() noexcept;
  // Members inside a collective now (tests; see reset()).
  int members_inside() const;
  // A group of the members left when the ranks `excluded` go (PyTorch's shrink of a process group; DataParallel
  // drops a failed device with it): the same options, the survivors in rank order (renumbered 0..). NCCL:
  // ncclCommShrink with NCCL_SHRINK_ABORT, which first ends collectives still in flight on this group's
  // communicators (a member stuck in one for good); the other backends: a new group over the survivors. This
  // group is aborted: every later collective on it throws. Call with no member inside a collective. Throws,
  // naming the values, for a rank out of range or listed twice, no survivor, or a group spanning processes.
  std::shared_ptr<ProcessGroup> shrink(const std::vector<int>& excluded);
  // The members (ranks in this process) that the last timeout waited for: who did not arrive, where the
  // timeout's own error names the member that waited. Empty before any timeout; kept across reset().
  std::vector<int> missing_at_last_timeout() const { return rendezvous_.missing_at_last_timeout(); }

  // Collectives completed since construction or reset_counters(), counted once per group (not per member).
  int64_t calls(Collective c) const { return calls_[static_cast<size_t>(c)].load(); }
  int64_t total_calls() const;
  void reset_counters();

  // Tests: member `rank`'s next call of `kind` throws "failure injected into <kind> on member <rank>" instead
  // of taking part (its partners then learn of it as of any member's failure). Call between collectives.
  void inject_failure_for_tests(int rank, Collective kind) {
    injected_kind_ = kind;
    injected_rank_ = rank;
  }
  // Tests: member `rank`'s next call of `kind` runs `stall` between its two meetings, after the lost-thread
  // checkpoint and before it reads any member's arguments (a member preempted there, or slow in the backend:
  // Note [A member that leaves early] in process_group.cc). Call between collectives.
  void inject_stall_for_tests(int rank, Collective kind, std::function<void()> stall) {
    stall_ = std::move(stall);
    stall_kind_ = kind;
    stall_rank_ = rank;
  }

 private:
  // The public constructor's work, with `backend` ready made (shrink) or, when null, made here.
  ProcessGroup(std::vector<Device> devices, ProcessGroupOptions options, std::unique_ptr<collectives::Backend> backend);
  using Posted = collectives::Posted;
  class Inside;  // a member's stay inside one collective (process_group.cc)
  template <typename Validate, typename Work>
  void run(int rank, std::shared_ptr<const Posted> mine, const Validate& validate, const Work& work);
  std::string check_common(const Posted& mine) const;
  // Every member's `field`: on its own device, contiguous, of member `reference`'s count and dtype ("" if so).
  std::string check_every(Tensor Posted::*field, const char* name, size_t reference) const;
  // Every member's `list`: one tensor per member, on its own device, contiguous, like its own `tensor`.
  std::string check_every_list(const char* name, const char* item, const char* relation) const;
  // gather/scatter: every member's `tensor` (on its own device, contiguous) and, in the root's process, the
  // root's `list` (one tensor per member of the world, on the root's device, contiguous, each like its
  // member's `tensor`).
  std::string check_root_list(int root, const char* list_name, const char* name, const char* relation) const;
  // An error only this member can see (its arguments are not posted yet): aborts the group so that the
  // others do not wait for it, then throws.
  [[noreturn]] void fail_alone(const std::string& message);
  void check_rank(int rank, const char* what);
  // This process's member at the root's place (the root itself when the group is one process): validation
  // compares every member with it.
  size_t local_member(int root) const { return static_cast<size_t>(root % size()); }
  void check_flat(int rank, const char* what, const Tensor& flat, const char* flat_name, const Tensor& piece);
  // all_reduce_into's arguments as this member alone can check them (throws through fail_alone).
  void check_pieces(int rank, const Tensor& output, const std::vector<Tensor>& inputs, double scale);

  std::vector<Device> devices_;
  CollectiveBackend backend_;
  Rendezvous rendezvous_;
  // Note [A member that leaves early] (process_group.cc). state_mutex_ guards the slots' writes and inside_;
  // the slots are read without it between a collective's two meetings, which order them with those writes.
  mutable std::mutex state_mutex_;
  std::vector<const Posted*> posted_;                     // member r's arguments, as the backends read them
  std::vector<std::shared_ptr<const Posted>> owned_;      // what keeps posted_[r] alive
  int inside_ = 0;                                        // members between entering a call and leaving it
  std::vector<int64_t> sequence_;      // per member: collectives called (error messages)
  std::vector<double> work_shares_;   // set_work_shares's, normalised
  std::array<std::atomic<int64_t>, kNumCollectives> calls_{};
  std::unique_ptr<collectives::Backend> backend_impl_;  // chosen once, by the constructor
  // inject_failure_for_tests: every member reads it, the member it names clears it (atomic: the others' reads
  // race with that write; TSan saw it).
  std::atomic<int> injected_rank_{-1};
  Collective injected_kind_ = Collective::AllReduce;
  std::atomic<int> stall_rank_{-1};  // inject_stall_for_tests, as injected_rank_
  Collective stall_kind_ = Collective::AllReduce;
  std::function<void()> stall_;
};

}  // namespace dpe
