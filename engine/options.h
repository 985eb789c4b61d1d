// What a DataParallel is built from (DataParallelOptions), what each step reports (StepReport), and the one
// place every option is checked (validate): a bad option is refused at construction, naming the value,
// before a replica is built or a device touched.
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/process_group.h"
#include "core/allocator.h"
#include "layers/loss.h"
#include "optim/optimizer.h"
#include "scatter_gather/chunking.h"
#include "scatter_gather/coalesced.h"

namespace dpe {

// DP: nn.DataParallel (master replica, per-step broadcast, reduce into the master, one optimizer).
// DDP: DistributedDataParallel's algorithm over the same worker threads (persistent replicas, each computes
// its own loss, bucketed all-reduce during backward, one optimizer per replica). See docs/DATA_PARALLEL.md.
// Auto (construction only): train_step times a few steps in DP mode, then as many in DDP mode, and keeps the
// faster (StepReport::auto_mode says which, with both times). Switching is DataParallel::set_mode.
enum class ParallelMode { DP, DDP, Auto };
const char* mode_name(ParallelMode mode);
enum class BufferPolicy { Replica0, Average };
// What the step API does when one replica fails (docs/DATA_PARALLEL.md "A failed device"):
//   Fail               rethrow its ReplicaError (PyTorch's behaviour);
//   DropDevice         drop that device (its replica, optimizer, worker), rebuild the group over the
//                      survivors, and redo the same step on them: nothing rolls back, since the optimizer has
//                      not run and DP's master / DDP's identical replicas hold the parameters;
//   RetrySmallerChunk  on an out-of-memory error, halve that device's share of the batch and redo the step
//                      (other errors are rethrown).
enum class DeviceFailurePolicy { Fail, DropDevice, RetrySmallerChunk };

struct DataParallelOptions {
  // Default (nullopt): every CUDA device if there is one, else every CPU device. An explicit list must be
  // non-empty, of one kind, without duplicates, of existing devices.
  std::optional<std::vector<Device>> device_ids;
  std::optional<Device> output_device;  // default device_ids[0]; any existing device (CPU included)
  int64_t dim = 0;
  SplitRule split = SplitRule::Chunk;
  std::vector<double> split_weights;  // SplitRule::Weighted only, one per device
  ParallelMode mode = ParallelMode::DP;
  // DP mode: which buffers the master keeps; the byte cap of DP's coalesced broadcasts and reductions.
  BufferPolicy buffers = BufferPolicy::Replica0;
  size_t bucket_bytes = kDefaultBucketBytes;
  // DDP mode, with PyTorch DistributedDataParallel's names and defaults.
  bool broadcast_buffers = true;        // replica 0's buffers to every replica before each synchronised forward
  bool find_unused_parameters = false;
  // Gradient bucket cap; unset: 25 MiB with a 1 MiB first bucket after the rebuild (PyTorch's defaults),
  // set: that cap for every bucket.
  std::optional<double> bucket_cap_mb;
  // DDP mode: the dtype gradient buckets travel in. Unset: the gradients' own (float32). bfloat16 halves
  // the bytes all-reduced, like PyTorch's bf16_compress_hook: each replica's weighted bucket is rounded to
  // bfloat16, summed in float32 and rounded once more, then written back into the float32 gradients (about 3
  // significant digits; docs/MIXED_PRECISION.md). float16 likewise (range 6e-5..65504: gradients outside it
  // flush to 0 or overflow). Not across processes on the mpi backend (MPI has no 16-bit float sum).
  std::optional<DType> reduce_dtype;
  // DDP mode's collectives. Mpi (or MpiNccl, through NCCL for CUDA devices): across the processes of an MPI
  // launch (docs/SCALE_OUT.md), in DDP mode the replicas of every process form one group (this process's
  // device_ids in each; parameters broadcast from global rank 0, gradients averaged over all of them); in DP
  // mode each process's master joins a group of masters whose gradients are averaged after each synchronised
  // backward of the step API. Every process
  // constructs its DataParallel at the same point.
  CollectiveBackend backend = CollectiveBackend::Auto;
  // A replica that never arrives: the collectives' timeout, and the straggler timeout after which a replica
  // still running when another has finished is declared lost (docs/DATA_PARALLEL.md "A failed device").
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Bitwise-reproducible steps whatever the device count and mode (engine/deterministic_step.cc,
  // docs/DATA_PARALLEL.md "Deterministic mode"): the step API cuts every batch into virtual_shards fixed
  // shards (0: max(4, devices)), runs each alone on whichever device, and sums their gradients in a fixed
  // tree by shard index. CPU devices, one process.
  bool deterministic = false;
  int64_t virtual_shards = 0;
  DeviceFailurePolicy on_device_failure = DeviceFailurePolicy::Fail;
  // DDP mode: ZeRO's stage (engine/zero_step.h, docs/DATA_PARALLEL.md "Memory: ZeRO"). 0: none, every replica
  // keeps the whole optimizer state; 1: each replica keeps the state of the 1/n of the elements it owns, steps
  // them, and all-gathers the parameters; 2: also only its 1/n of the reduced gradients (buckets are
  // reduce-scattered during backward). Results are plain DDP's. Across processes too (the shards span every
  // process's devices; DataParallel::consolidate_state_dict before saving the optimizer).
  int zero_stage = 0;
};

// What the last step did. Times are host wall-clock milliseconds per phase (on CUDA, work is asynchronous:
// a phase's time includes waiting for earlier work that its copies depend on).
// backward_ms is the whole backward, gradient reduction included; reduce_ms the part of it spent reducing (DP:
// what was left after the replicas' backward; DDP: inside the overlapped all-reduces).
// DDP mode: phases run on every replica at once; a phase's time is the slowest replica's. broadcast is the buffer
// broadcast (ZeRO: and the parameters all-gathered after the optimizer, whose time is in optimizer_ms);
// reduce.bytes is the gradient bytes all-reduced (ZeRO-2: reduce-scattered), summed over replicas;
// reduce.transfers the all-reduce calls.
struct StepReport {
  ParallelMode mode = ParallelMode::DP;
  std::vector<int64_t> chunk_sizes;
  std::vector<Device> used_devices;
  double scatter_ms = 0, broadcast_ms = 0, forward_ms = 0, gather_ms = 0, loss_ms = 0, backward_ms = 0,
         reduce_ms = 0, optimizer_ms = 0;
  TransferStats scatter, broadcast, gather, reduce;
  int64_t buckets = 0;
  int64_t buckets_reduced_during_backward = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();  // forward_backward: the batch's loss
  // ParallelMode::Auto: the median train_step time of each mode measured so far (0 before any), and the
  // choice once both are measured.
  struct AutoMode {
    double dp_step_ms = 0, ddp_step_ms = 0;
    std::optional<ParallelMode> chosen;
  };
  std::optional<AutoMode> auto_mode;
  // Per device_ids entry: when it finished its part of this step, in milliseconds from the step's start (DP:
  // its forward and its backward, each from its phase's start; DDP: until it entered its last collective), 0
  // for an unused device; what the auto split measures (Note [What the auto split measures]); step API only.
  std::vector<double> device_compute_ms;
  // SplitRule::Auto: the weights the step's chunk sizes came from (updated after the step) and each
  // device's smoothed time per sample in milliseconds; empty otherwise.
  std::vector<double> split_weights, ms_per_sample;
  // What on_device_failure recovered from during this step, in order ("dropped cpu:1 (replica 1): <error>;
  // the step was redone on cpu:0 cpu:2"); empty when nothing failed.
  std::vector<std::string> recovered_failures;
  // Per device_ids entry, after the step: the allocator's statistics, with the bytes by MemoryKind now and at the
  // peak (parameters, gradients, optimizer state, activations and temporaries; core/allocator.h).
  std::vector<std::pair<Device, MemoryStats>> memory;
  // With a GradScaler (DataParallel::set_grad_scaler): the scale this step's backward used (1 without one)
  // and whether optimizer_step skipped the update because a gradient held an inf or NaN.
  double loss_scale = 1.0;
  bool skipped_step = false;
};

// LossFn (layers/loss.h): the loss of a batch (DP: the gathered output, on output_device) or of one replica's
// shard (DDP: on the replica's device, run on its worker thread, so it must be thread-safe): a 0-dim tensor.
// Makes an optimizer over the given parameters: DP calls it once (master), DDP once per replica.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>& params)>;

// Where a DataParallel runs, from its validated options.
struct Placement {
  std::vector<Device> device_ids;  // options.device_ids, or the default (every CUDA device, else every CPU one)
  Device output_device;
};

// Checks every option (and that `given_replicas` modules fit: one, or one per device in DDP mode); throws
// dpe::Error naming the offending value and what was expected.
Placement validate(const DataParallelOptions& options, size_t given_replicas);

}  // namespace dpe
