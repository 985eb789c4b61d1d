// This process's place among the processes of an MPI launch (`mpirun -np P`, Slurm's `srun --mpi=pmix`), and
// the one cross-process collective the scale-out backends build on (docs/SCALE_OUT.md).
// Internal to //collectives.
//
// MpiWorld::get() initialises MPI once per process with MPI_THREAD_MULTIPLE (every device thread of a process
// takes part in cross-process collectives at once, each on its own communicator) and reads the launch: rank and
// size from MPI_COMM_WORLD, the local rank and size from the shared-memory split (the processes on this host),
// the host name. It exports torchrun's variables RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE for user code,
// after checking any that are already set against MPI's view (an inconsistent launch is an error naming the
// variable and both values). MPI is finalised at process exit.
//
// MpiComm: a duplicate of MPI_COMM_WORLD (or of a split of it) with errors returned, not fatal
// (MPI_ERRORS_RETURN), a sequence number per collective and the group's timeout.
// Contract for every MpiComm collective:
//  - every process of the communicator calls the same collectives in the same order; one thread per MpiComm at
//    a time (a device thread owns its communicator);
//  - every process passes the same size (and dtype, root): a difference throws on every process, naming each
//    process's value, before any byte moves, and leaves the communicator usable;
//  - a process that does not arrive within the timeout is an error on every process that waits:
//    "collective #seq (what): rank j did not arrive within T s", naming every missing rank (as is a transfer
//    that every rank arrived for but that does not finish within it); both are of kind ErrorKind::Timeout. The
//    communicator is then aborted: every later call throws at once, of kind ErrorKind::Aborted (the caller
//    exits with an error, and the launcher ends the job);
//  - an error MPI reports (a peer that died mid-collective, a transport failure) throws with MPI's message;
//  - a failure another process announced on the communicator's MpiAbortChannel ends a wait at once:
//    "collective #seq (what): rank j failed: <its reason>", of kind ErrorKind::Aborted, and aborts the
//    communicator;
//  - a call returns when `data` holds the result.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/reduce_buffers.h"
#include "core/dtype.h"

namespace dpe::collectives {

// Throws dpe::Error "<call> failed: <MPI's message>" when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* call);

struct ProcessPlace {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string host;
};

// The launch check, apart from MPI so that it is tested without a launch: for each of torchrun's variables
// that `getenv` finds set, its value must be `place`'s (same integer, no other text); throws naming the
// variable, its value and MPI's.
void check_launch_environment(const ProcessPlace& place, const std::function<const char*(const char*)>& getenv);

class MpiWorld {
 public:
  // Initialises MPI on the first call (throws if the MPI library cannot give MPI_THREAD_MULTIPLE, or if the
  // application initialised MPI itself with less); thread-safe.
  static MpiWorld& get();
  // Whether this process was started by an MPI launcher (Open MPI's or PMIx's variables are set), without
  // initialising MPI.
  static bool launched_by_mpi();

  const ProcessPlace& place() const { return place_; }

 private:
  MpiWorld();
  ProcessPlace place_;
};

// How the processes of one group tell each other that one of them failed (a replica threw), so that the
// others stop waiting for it at once, with its reason, instead of at the timeout. One per group that spans
// processes; its communicators' waits listen to it. Construction is collective (a duplicate of
// MPI_COMM_WORLD). Thread-safe.
class MpiAbortChannel {
 public:
  MpiAbortChannel();
  ~MpiAbortChannel();
  MpiAbortChannel(const MpiAbortChannel&) = delete;
  MpiAbortChannel& operator=(const MpiAbortChannel&) = delete;

  // Sends `reason` to every other process, once, unless this process already heard of another's failure
  // (which is then the cause, and the others have heard of it too).
  void announce(const std::string& reason);
  // "rank j failed: <reason>" once another process has announced (polled without blocking); "" before.
  std::string heard();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::mutex mutex_;                  // one thread probes and receives at a time
  std::atomic<bool> heard_any_{false};
  std::atomic<bool> announced_{false};
  std::string heard_;                 // written once under mutex_, before heard_any_ is set
};

class MpiComm {
 public:
  // A duplicate of MPI_COMM_WORLD (collective: every process calls it, in the same order). Its waits listen
  // to `failures` when given: another process's announced failure ends them with its reason.
  explicit MpiComm(std::chrono::milliseconds timeout, MpiAbortChannel* failures = nullptr);
  ~MpiComm();
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t collectives_started() const { return seq_; }

  // In place over `count` elements of `dtype` at `data` (host memory): float32, float64, int32, int64. Avg
  // divides the sum by size() (float dtypes only). `what` names the collective in errors ("bucket 3").
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op, const std::string& what);
  // recv (`count` elements) = op over every process of its send block `rank()` (send: size() x count
  // elements, host memory); float32, float64, int32, int64; Avg is the caller's (pass Sum). count < 2^31.
  void reduce_scatter_block(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                            const std::string& what);
  // recv (host memory, size() x bytes) = every process's `bytes` bytes at `send`, in rank order. bytes < 2^31.
  void all_gather(const void* send, void* recv, int64_t bytes, const std::string& what);
  // On process `root`, recv (host memory, size() x bytes) = every process's `bytes` bytes at `send`, in rank
  // order; recv is not touched elsewhere (may be null). bytes < 2^31.
  void gather(const void* send, void* recv, int64_t bytes, int root, const std::string& what);
  // recv (`bytes` bytes) = block rank() of process `root`'s send (size() x bytes; not read elsewhere, may be
  // null). bytes < 2^31.
  void scatter(const void* send, void* recv, int64_t bytes, int root, const std::string& what);
  // Every process sends send_bytes[q] bytes to process q, read from `send` in q order, and receives
  // recv_bytes[q] bytes from process q, written to `recv` in q order (host memory; totals < 2^31). The counts
  // are the caller's to agree on beforehand (each side's recv_bytes[q] must be q's send_bytes[rank()]): the
  // arrival token only checks that every process is in the same collective.
  void all_to_all(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                  const std::vector<int64_t>& recv_bytes, const std::string& what);
  // `bytes` bytes at `data` (host memory), from process `root` to every process.
  void broadcast(void* data, int64_t bytes, int root, const std::string& what);
  void barrier(const std::string& what);
  // Every rank tells every other that it reached collective seq_ and with which arguments (`signature`: what
  // must agree, e.g. {element count, dtype}); returns when all have, throws naming the ranks that did not
  // within the timeout, or every rank's signature when they differ (`signature_names`: "elements, dtype").
  // Each collective above starts with it; a transport of its own (NCCL) calls it to get the same checks.
  void arrive(const std::string& what, const std::vector<int64_t>& signature, const char* signature_names);

  // Tests only: called by every arrive() on this process once all ranks arrived, before the transfer (a
  // test stops its process there, to be the rank that stalls a transfer). nullptr: none.
  static void set_after_arrival_hook_for_testing(void (*hook)());

 private:
  // Waits for `request` until the deadline; throws (and aborts the communicator) past it.
  void wait(MPI_Request& request, std::chrono::steady_clock::time_point deadline, const std::string& what);
  // Note [Naming the rank that stalls a transfer] (mpi_world.cc): "rank 1" (or "ranks 1, 3") that sent no
  // roll-call token within the grace; "" when every peer did.
  std::string silent_peers();
  void check_not_aborted(const std::string& what) const;
  // gather and scatter: MPI_Igather or MPI_Iscatter (`call`, named `name`) of `bytes` bytes per process.
  using RootedCall = int (*)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, int, MPI_Comm, MPI_Request*);
  void rooted(RootedCall call, const char* name, const void* send, void* recv, int64_t bytes, int root,
              const std::string& what);

  // Throws (and aborts this communicator) when `failures` heard of another process's failure.
  void check_failures(const std::string& what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  MpiAbortChannel* failures_;
  int64_t seq_ = 0;
  std::string aborted_;  // why, once aborted
};

}  // namespace dpe::collectives
