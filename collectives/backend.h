// The backend seam of ProcessGroup (internal to //collectives): what moves the bytes of a collective once the
// group has met every member and checked every member's arguments. ProcessGroup (process_group.h) keeps
// validation, the rendezvous, timeouts and abort; a Backend only does the transfer and the arithmetic. The
// backend is chosen once, when the group is constructed (backend_registry.h); no collective branches on it.
//
// Contract for every backend:
//  - it is constructed once per group with the members' devices (rank = position), after the group has
//    checked that the devices are distinct, of one kind, existing, and that this backend may serve them;
//  - every method is called by member `rank`'s own thread, concurrently with the other members' calls of the
//    same method, between the group's two meetings: `posted` holds every member's arguments (posted[rank] is
//    the caller's own), already validated (sizes, dtypes, devices, contiguity, root, op agree), and stays
//    valid until the method returns on every member; the method may read and write other members' buffers
//    but must be done with them when it returns;
//  - a method writes this member's outputs as the collective's comment in process_group.h says (CUDA:
//    ordered before later work on the member's stream) and throws dpe::Error on failure (the group carries
//    the exception past the second meeting and rethrows it on this member);
//  - a method never waits for another member on its own: the group has met them all before the call and
//    meets them again after it (a backend whose calls do wait, as NCCL's do, relies on that first meeting).
// Adding a backend (mpi_backend.h is the latest): one new file pair `collectives/<name>_backend.{h,cc}` with a class deriving
// from Backend (or from SharedMemoryBackend to keep its copies for the collectives it does not do natively)
// and a `make_<name>_backend(devices)` function, plus one registration: a value in CollectiveBackend
// (collective_types.h, with its backend_name) and one `case` in make_backend (backend_registry.cc), with the
// library in collectives/BUILD's :backend_registry deps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_types.h"
#include "core/error.h"
#include "core/tensor.h"

namespace dpe::collectives {

// One member's arguments for the collective in flight. The group owns it (a shared_ptr) from the moment the
// member posts it until no member can read it any more (Note [A member that leaves early] in
// process_group.cc): it holds its tensors, never refers into the caller's frame.
struct Posted {
  Collective kind;
  int root = 0;
  ReduceOp op = ReduceOp::Sum;
  Tensor tensor;              // all_reduce/broadcast/reduce: the tensor; all_gather/gather: input;
                              // reduce_scatter/scatter: output
  Tensor flat;                // the tensor forms' other side (all_gather output, reduce_scatter input)
  std::vector<Tensor> list;   // all_gather/gather outputs, reduce_scatter/scatter/all_to_all inputs
  std::vector<Tensor> list2;  // all_to_all outputs
  std::vector<uint8_t> bytes;  // broadcast_object: the root's bytes (a copy; empty on the other members)
  double scale = 1.0;         // all_reduce_into: this member's factor
};

// Every member's arguments, by rank.
using PostedAll = std::vector<const Posted*>;

// How a backend serves all_gather_into_tensor and reduce_scatter_tensor: as the list forms over slices of
// the flat tensor (validated as lists), or natively on the flat tensor (validated as tensors).
enum class FlatForms { AsLists, Native };

// Elements [begin, end) of `t`, flattened.
inline Tensor flat_slice(const Tensor& t, int64_t begin, int64_t end) {
  return t.view({-1}).narrow(0, begin, end - begin);
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual FlatForms flat_forms() const = 0;
  // The processes the group spans (the members of each are this group's devices; backends within one
  // process: 1) and this process's index among them. Global rank = process_index() * members + rank.
  virtual int processes() const { return 1; }
  virtual int process_index() const { return 0; }

  // Each: the collective of the same name in process_group.h, for member `rank`, on `posted`.
  virtual void all_reduce(int rank, const PostedAll& posted) = 0;
  virtual void broadcast(int rank, const PostedAll& posted) = 0;
  virtual void reduce(int rank, const PostedAll& posted) = 0;
  virtual void all_gather(int rank, const PostedAll& posted) = 0;
  virtual void reduce_scatter(int rank, const PostedAll& posted) = 0;
  // Called only when flat_forms() is Native (posted[k]->flat is the flat tensor).
  virtual void all_gather_into_tensor(int rank, const PostedAll& posted) = 0;
  virtual void reduce_scatter_tensor(int rank, const PostedAll& posted) = 0;
  virtual void gather(int rank, const PostedAll& posted) = 0;
  virtual void scatter(int rank, const PostedAll& posted) = 0;
  virtual void all_to_all(int rank, const PostedAll& posted) = 0;
  virtual std::vector<uint8_t> broadcast_object(int rank, const PostedAll& posted) = 0;
  // Whether all_reduce_into can read every member's pieces where they are (list: the pieces, tensor: the
  // output, scale) for outputs of `dtype`. Otherwise the group copies each member's scaled pieces into its
  // output before the members meet, and calls all_reduce (the default: no backend but the CPU one can).
  virtual bool reduces_pieces_in_place(DType dtype) const { return false; }
  virtual void all_reduce_into(int rank, const PostedAll& posted) {
    DPE_INTERNAL_ASSERT(false, "all_reduce_into called on a backend that does not read pieces in place");
  }
  // ProcessGroup::set_work_shares, validated and normalised (empty: equal). Called between collectives.
  virtual void set_work_shares(const std::vector<double>& shares) {}
  // The group's two meetings already make a barrier among this process's members; a backend that spans
  // processes meets the other processes here.
  virtual void barrier(int rank) {}
  // ProcessGroup::abort, after this process's members were woken: a backend that spans processes tells the
  // others (any thread may call it, while members are inside a method).
  virtual void abort(const std::string& reason) {}
  // ProcessGroup::shrink: a backend for `survivors`, the members left when the ranks `excluded` (sorted) go,
  // made from this one where that is needed (NCCL: ncclCommShrink, which also ends operations still in flight
  // on this backend's communicators; this backend is unusable afterwards), or nullptr for a fresh one
  // (make_backend). Called by the group's owner, with no member inside a method.
  virtual std::unique_ptr<Backend> shrink(const std::vector<int>& excluded, const std::vector<Device>& survivors) {
    return nullptr;
  }
};

}  // namespace dpe::collectives
