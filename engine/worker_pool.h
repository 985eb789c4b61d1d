// One persistent worker thread per device (docs/DESIGN.md "Threads, streams, errors").
//
// run(count, fn) runs fn(i) on worker i for i in [0, count) at the same time and returns when all have
// finished. A worker that throws does not stop the others: every exception is caught and numbered in the
// order the failures happened, and after all workers have finished the FIRST one (the root cause: in DDP a
// failing replica aborts the collectives its partners are waiting in, so their errors come after it and are
// consequences) is rethrown in the caller as ReplicaError, the later ones attached as later_failures(); each
// keeps the kind of its original exception (error_kind_of in engine/replica_error.h).
// run's on_failure(i, error) runs on worker i right after its failure was numbered, before any later
// failure can be: that is where a caller wakes partners blocked on worker i (ProcessGroup::abort). It must
// not throw (what it throws is dropped, and the partners it did not wake wait for their timeout): out of
// memory is the likely failure there, so it builds nothing it needs in order to wake them.
// No thread is created after construction (threads_created() stays constant).
//
// CPU workers get their share of the cores (the cores this process may run on, by its affinity mask, / the
// number of CPU devices in the pool, at least 1) for intra-op parallelism: each runs its tasks inside its
// own oneTBB task_arena of that size and sets its OpenMP thread count (oneDNN's runtime) to it, so devices do
// not oversubscribe the machine.
// Unequal CPU devices, for tests and demonstrations ($DPE_CPU_DEVICE_CORES, docs/DATA_PARALLEL.md "The auto
// split"): "0;0;0;1" pins cpu:0, cpu:1 and cpu:2 to core 0 and cpu:3 to core 1 (entry i is cpu:i's cores, a
// comma list; an empty or missing entry leaves that device unpinned), so cpu:3 runs three times as fast as
// each of the others. A pinned worker uses as many intra-op threads as it has cores (its OpenMP threads
// inherit its mask). Checked when a pool is built: a malformed entry or a core outside the process's
// affinity mask is an error naming both.
// The caller's grad mode and autocast state (core/amp/autocast.h) are carried into the worker for the duration
// of the task.
// Straggler timeout (off by default): a worker that has not finished its task that long after the first
// worker of the same run finished is declared lost, as stuck in a kernel or a wait: it is reported as a failure
// ("did not finish within ... the device is lost", of kind ErrorKind::DeviceLost), never runs again, and its
// thread is left behind (a thread cannot be killed) and parks at its next lost-thread checkpoint
// (core/lost_thread.h). run() gives it up to a second more to end or park (a worker that was only slow) before
// it returns without it; whatever a worker still blocked then may use, the caller keeps alive for good
// (Note [Lost workers] in worker_pool.cc). Within a run of one worker nothing is compared, so nothing is
// declared lost.
//
// Thread-safety: run() may be called from one thread at a time, never from a worker of the same pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "core/cpu_cores.h"  // usable_cores(), which sizes the pool
#include "core/device.h"
#include "engine/replica_error.h"

namespace dpe {

// $DPE_CPU_DEVICE_CORES's value parsed: entry i = the cores of cpu:i (empty: not pinned). Throws on a
// malformed entry or a core this process may not run on, naming the value.
std::vector<std::vector<int>> parse_cpu_device_cores(const std::string& text);
// The cores $DPE_CPU_DEVICE_CORES pins `device` to: empty when the variable is unset or empty, has no entry
// for it, or `device` is not a CPU device. Throws as parse_cpu_device_cores does.
std::vector<int> pinned_cpu_device_cores(const Device& device);

class DeviceWorkerPool {
 public:
  // cpu_threads > 0: every unpinned CPU worker uses exactly that many intra-op threads (the deterministic
  // mode's 1: results that do not depend on how many devices share the cores). straggler_timeout: see the
  // file comment (0: off).
  explicit DeviceWorkerPool(std::vector<Device> devices, int cpu_threads = 0,
                            std::chrono::milliseconds straggler_timeout = std::chrono::milliseconds(0));
  ~DeviceWorkerPool();
  DeviceWorkerPool(const DeviceWorkerPool&) = delete;
  DeviceWorkerPool& operator=(const DeviceWorkerPool&) = delete;

  size_t size() const;
  const std::vector<Device>& devices() const;
  // Runs fn(i) on workers 0..count-1 (count <= size()) and waits for all of them. on_failure: see the file
  // comment (it must not throw; what it throws is ignored).
  using FailureCallback = std::function<void(size_t replica, const std::exception_ptr& error)>;
  void run(size_t count, const std::function<void(size_t replica)>& fn, const FailureCallback& on_failure = {});
  // Total threads this pool ever started (tests: constant after construction).
  int64_t threads_created() const;
  // Intra-op threads each CPU worker uses.
  int cpu_threads_per_device() const;
  // The workers declared lost so far (indices into devices()), in order.
  std::vector<size_t> lost_workers() const;
  // Whether any worker was ever declared lost (allocates nothing: failure handlers call it).
  bool has_lost_workers() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the worker threads (Note [Lost workers])
};

}  // namespace dpe
