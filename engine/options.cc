#include "engine/options.h"

#include <set>

#include "core/error.h"

namespace dpe {

const char* mode_name(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::DP: return "dp";
    case ParallelMode::DDP: return "ddp";
    case ParallelMode::Auto: return "auto";
  }
  return "?";
}

namespace {

// check_device_exists's error, prefixed with the option the device came from (the original's location kept).
void check_exists(const Device& device, const char* option) {
  try {
    check_device_exists(device);
  } catch (const Error& e) {
    throw Error(detail::str_cat("DataParallel: ", option, ": ", e.what()));
  }
}

std::vector<Device> checked_device_ids(const DataParallelOptions& options) {
  if (!options.device_ids.has_value()) {
    return cuda_available() ? all_devices(DeviceKind::CUDA) : all_devices(DeviceKind::CPU);
  }
  const std::vector<Device>& ids = *options.device_ids;
  DPE_CHECK(!ids.empty(), "DataParallel: device_ids is empty; expected at least one device (or leave it unset for "
            "every visible device)");
  std::set<Device> seen;
  for (const Device& d : ids) {
    DPE_CHECK(d.kind == ids[0].kind, "DataParallel: device_ids mixes ", ids[0], " and ", d,
              "; all devices must be of one kind");
    DPE_CHECK(seen.insert(d).second, "DataParallel: device_ids contains ", d, " more than once");
    check_exists(d, "device_ids");
  }
  return ids;
}

void check_mode(const DataParallelOptions& options, size_t given_replicas, size_t devices) {
  DPE_CHECK(given_replicas == 1 || given_replicas == devices, "DataParallel: ", given_replicas, " replicas for ",
            devices, " devices; expected one per device_ids entry");
  DPE_CHECK(options.mode != ParallelMode::Auto || !spans_processes(options.backend), "DataParallel: mode auto "
            "switches modes, which is not supported across processes (backend '", backend_name(options.backend),
            "'); expected dp or ddp");
  DPE_CHECK(!options.bucket_cap_mb.has_value() || *options.bucket_cap_mb > 0,
            "DDP: bucket_cap_mb must be positive, got ", options.bucket_cap_mb.value_or(0));
}

void check_split(const DataParallelOptions& options, size_t devices) {
  DPE_CHECK(options.split != SplitRule::Weighted || options.split_weights.size() == devices,
            "DataParallel: the weighted split needs one weight per device (", devices, "), got ",
            options.split_weights.size());
}

void check_reduce_dtype(const DataParallelOptions& options) {
  const std::optional<DType> wire = options.reduce_dtype;
  if (!wire) return;
  DPE_CHECK(*wire == DType::Float32 || *wire == DType::BFloat16 || *wire == DType::Float16,
            "DataParallel: reduce_dtype ", *wire, " is not float32, bfloat16 or float16");
  DPE_CHECK(options.backend != CollectiveBackend::Mpi || *wire == DType::Float32, "DataParallel: reduce_dtype ",
            *wire, " cannot cross processes on the mpi backend (MPI has no ", *wire,
            " sum); use the mpi-nccl backend on CUDA devices, or float32");
  DPE_CHECK(!options.deterministic, "DataParallel: reduce_dtype ", *wire, " applies to DDP's bucket all-reduce, "
            "which the deterministic mode does not use (it sums shard gradients in float32 in a fixed order)");
}

void check_deterministic(const DataParallelOptions& options) {
  if (!options.deterministic) {
    DPE_CHECK(options.virtual_shards == 0, "DataParallel: virtual_shards = ", options.virtual_shards,
              " is the deterministic mode's; set deterministic = true or leave it 0");
    return;
  }
  DPE_CHECK(options.virtual_shards >= 0, "DataParallel: virtual_shards must be >= 0 (0: the default), got ",
            options.virtual_shards);
  DPE_CHECK(!spans_processes(options.backend), "DataParallel: the deterministic mode runs in one process; backend '",
            backend_name(options.backend), "' spans processes");
  DPE_CHECK(options.split != SplitRule::Auto && options.split != SplitRule::Weighted, "DataParallel: the "
            "deterministic mode cuts batches into its own virtual shards; split ", split_rule_name(options.split),
            " does not apply (use chunk)");
}

void check_zero(const DataParallelOptions& options) {
  if (options.zero_stage == 0) return;
  DPE_CHECK(options.zero_stage == 1 || options.zero_stage == 2, "DataParallel: zero_stage ", options.zero_stage,
            " is not a ZeRO stage; expected 0 (none), 1 (optimizer state) or 2 (optimizer state and gradients)");
  DPE_CHECK(options.mode == ParallelMode::DDP, "DataParallel: zero_stage ", options.zero_stage, " shards DDP "
            "mode's optimizers; mode ", mode_name(options.mode), " has ", options.mode == ParallelMode::DP ? "one" :
            "a DP phase with one", "; use mode ddp");
}

}  // namespace

Placement validate(const DataParallelOptions& options, size_t given_replicas) {
  Placement placement{.device_ids = checked_device_ids(options), .output_device = {}};
  placement.output_device = options.output_device.value_or(placement.device_ids[0]);
  check_exists(placement.output_device, "output_device");
  const size_t devices = placement.device_ids.size();
  check_mode(options, given_replicas, devices);
  check_split(options, devices);
  check_reduce_dtype(options);
  check_deterministic(options);
  check_zero(options);
  return placement;
}

}  // namespace dpe
