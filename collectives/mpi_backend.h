// The MPI backend (internal to //collectives): one group over the devices of every process of an MPI launch
// (mpirun, srun), each process contributing the same number T of members, its own devices. CPU devices, or
// CUDA devices: Debian's Open MPI is not CUDA-aware, so what crosses processes is staged through pinned host
// memory (blocking copies: the member's earlier work is done before, and the result is in place after).
//
// all_reduce is hierarchical (Horovod's scheme, docs/SCALE_OUT.md): member t reduces its share (share_of, as
// the shared-memory backend) of every local member's tensor into its own tensor, all-reduces that share
// across processes on its own communicator cross[t] (one MPI_Comm_dup per local index, all T members in MPI
// at once under MPI_THREAD_MULTIPLE), then writes the result into the other local members' tensors. A member
// reads and writes only its own share of the others' tensors, so no member waits for another inside the call
// (backend.h's contract); a process that does not arrive is named after the group's timeout (MpiComm), and a
// process whose member failed (ProcessGroup::abort) tells the others at once (MpiAbortChannel).
// Avg divides by the world size (processes x T). Dtypes: float32, float64, int32, int64 (Avg: float only).
// broadcast from global root g = p·T + t: in process p every member copies member t's tensor, then member k of
// every process receives process p's member k over cross[k] (T broadcasts at once, none waiting for another
// member). barrier: member t of every process meets over cross[t], and the group's meetings join the members
// of each process. all_gather (both forms): member t gathers member t's input of every process over cross[t]
// and writes each into its slot (global rank) of every local member's output. reduce_scatter (both forms):
// the mirror image (scatter_mine). reduce: an all-reduce of each member's share into a copy, written into the
// root's tensor by the root's process. broadcast_object: the size, then the bytes, from the root's process over
// every member's communicator. gather and scatter: member t of every process exchanges member t's piece with
// the root's process over cross[t] (MPI_Igather, MPI_Iscatter), and in the root's process member t reads or
// writes the root's list entries of global ranks p·T + t. all_to_all: member t of process p sends member t of
// process q what every member of p has for global rank q·T + t (MPI_Ialltoallv over cross[t]); the counts are
// agreed on first: every member all-gathers its process's table of sizes and dtypes over its communicator, so
// every member of every process checks every pair alike and a mismatch throws everywhere with the same
// message before any byte moves. gather, scatter and all_to_all move bytes (any dtype).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/mpi_world.h"
#include "collectives/shared_memory_backend.h"

namespace dpe::collectives {

class MpiBackend : public SharedMemoryBackend {
 public:
  // Collective over the processes: checks that every process has devices.size() members (naming the counts
  // when not), then makes the T cross-process communicators.
  MpiBackend(std::vector<Device> devices, std::chrono::milliseconds timeout);

  // The flat forms natively: their flat tensors span every process.
  FlatForms flat_forms() const override { return FlatForms::Native; }
  int processes() const override { return processes_; }
  int process_index() const override { return process_index_; }

  void all_reduce(int rank, const PostedAll& posted) override;
  // The pieces of other processes are out of reach: the group copies them into the output first.
  bool reduces_pieces_in_place(DType) const override { return false; }
  void broadcast(int rank, const PostedAll& posted) override;
  void reduce(int rank, const PostedAll& posted) override;
  void all_gather(int rank, const PostedAll& posted) override;
  void reduce_scatter(int rank, const PostedAll& posted) override;
  void all_gather_into_tensor(int rank, const PostedAll& posted) override;
  void reduce_scatter_tensor(int rank, const PostedAll& posted) override;
  void gather(int rank, const PostedAll& posted) override;
  void scatter(int rank, const PostedAll& posted) override;
  void all_to_all(int rank, const PostedAll& posted) override;
  std::vector<uint8_t> broadcast_object(int rank, const PostedAll& posted) override;
  void barrier(int rank) override;
  void abort(const std::string& reason) override { failures_->announce(reason); }

 protected:
  std::unique_ptr<MpiAbortChannel> failures_;    // what the cross communicators' waits listen to
  std::vector<std::unique_ptr<MpiComm>> cross_;  // [t]: member t of every process

 private:
  // `t` itself on a CPU device; else a copy of it in pinned host memory (what MPI reads and writes), and
  // back_to_device copies such a copy into `t`.
  static Tensor on_host(const Tensor& t);
  static void back_to_device(const Tensor& t, const Tensor& host);
  // t's bytes, appended to `bytes`; and t = the bytes at `from` (t.nbytes() of them), whatever t's device.
  static void append_bytes(std::vector<uint8_t>& bytes, const Tensor& t);
  static void assign_bytes(const Tensor& t, const uint8_t* from);
  // Host memory for what MPI writes: `count` elements, pinned when member `rank` is a CUDA device.
  Tensor host_buffer(int64_t count, DType dtype, int rank) const;
  // Both all-gathers: member `rank` gathers member `rank`'s input of every process and writes the piece of
  // process p into slot(member, p * size() + rank) of every local member.
  void gather_mine(int rank, const PostedAll& posted, const std::function<Tensor(const Posted&, int64_t)>& slot);
  // Both reduce-scatters: member `rank` combines, for every process p, the local members' input slot
  // slot(member, p * size() + rank) into block p, and the processes reduce-scatter the blocks over cross[rank]:
  // block p of the result is process p's member `rank`'s output.
  void scatter_mine(int rank, const PostedAll& posted, const std::function<Tensor(const Posted&, int64_t)>& slot);

  int processes_ = 1;
  int process_index_ = 0;
  // all_to_all's bytes to send and received, per member (member t's thread only), kept from call to call:
  // fresh buffers of tens of MB cost a page fault every 4 KiB at every call (an all_to_all of 64 MiB between
  // two processes took 122 ms with them). They hold the largest all_to_all's bytes until the group goes.
  struct Staging {
    std::vector<uint8_t> sent, received;
  };
  std::vector<Staging> staging_;
};

std::unique_ptr<Backend> make_mpi_backend(const std::vector<Device>& devices, std::chrono::milliseconds timeout);

}  // namespace dpe::collectives
