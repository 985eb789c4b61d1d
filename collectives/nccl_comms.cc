#include "collectives/nccl_comms.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_device.h"

namespace dpe {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int64: return ncclInt64;
    case DType::Int32: return ncclInt32;
    case DType::UInt8: return ncclUint8;
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  DPE_INTERNAL_ASSERT(false, "unknown reduce op");
}

}  // namespace

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId), "NcclUniqueId must hold an ncclUniqueId");

NcclUniqueId make_nccl_unique_id() {
  ncclUniqueId id;
  DPE_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclUniqueId bytes;
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

struct NcclComms::Impl {
  int first_rank = 0;  // this process's members are ranks first_rank, first_rank + 1, ... of world_size
  int world_size = 0;
  std::vector<int> logical;
  std::vector<ncclComm_t> comms;
  std::vector<cudaEvent_t> done;    // per member: recorded by wait(), created on first use
  std::vector<std::string> aborted;  // per member: why its communicator was aborted ("" if it was not)
};

NcclComms::NcclComms(const std::vector<int>& logical_devices) : impl_(std::make_unique<Impl>()) {
  impl_->logical = logical_devices;
  impl_->world_size = static_cast<int>(logical_devices.size());
  std::vector<int> physical;
  for (int d : logical_devices) physical.push_back(cuda::physical_device(d));
  impl_->comms.resize(physical.size());
  DPE_NCCL_CHECK(ncclCommInitAll(impl_->comms.data(), static_cast<int>(physical.size()), physical.data()));
}

NcclComms::NcclComms(const std::vector<int>& logical_devices, const NcclUniqueId& id, int world_size, int first_rank)
    : impl_(std::make_unique<Impl>()) {
  impl_->first_rank = first_rank;
  impl_->world_size = world_size;
  impl_->logical = logical_devices;
  impl_->comms.resize(logical_devices.size());
  ncclUniqueId unique;
  std::memcpy(&unique, id.data(), sizeof unique);
  // Several ranks of one clique from one thread: NCCL needs them in one group.
  DPE_NCCL_CHECK(ncclGroupStart());
  for (size_t t = 0; t < logical_devices.size(); ++t) {
    cuda::DeviceGuard guard(logical_devices[t]);
    const ncclResult_t status = ncclCommInitRank(&impl_->comms[t], world_size, unique, first_rank + static_cast<int>(t));
    if (status != ncclSuccess) {
      ncclGroupEnd();
      DPE_NCCL_CHECK(status);
    }
  }
  DPE_NCCL_CHECK(ncclGroupEnd());
}

NcclComms::NcclComms(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<NcclComms> NcclComms::shrink(const std::vector<int>& excluded) {
  for (size_t i = 0; i < excluded.size(); ++i) {
    DPE_CHECK(excluded[i] >= 0 && excluded[i] < impl_->world_size && (i == 0 || excluded[i] > excluded[i - 1]),
              "NcclComms::shrink: excluded ranks must be sorted, distinct and in [0, ", impl_->world_size,
              "); got ", excluded[i], " at position ", i);
  }
  auto is_excluded = [&](int rank) { return std::binary_search(excluded.begin(), excluded.end(), rank); };
  auto shrunk = std::make_unique<Impl>();
  shrunk->world_size = impl_->world_size - static_cast<int>(excluded.size());
  // Ranks are renumbered in order: a survivor's new rank is its old one less the excluded ranks below it.
  shrunk->first_rank = impl_->first_rank - static_cast<int>(std::lower_bound(excluded.begin(), excluded.end(),
                                                                             impl_->first_rank) - excluded.begin());
  // NCCL takes a non-const list (it sorts it). It refuses an empty one (ncclCommInitChildComm in NCCL's
  // src/init.cc requires excludeRanksCount > 0: "invalid argument" otherwise), so a shrink by
  // nobody splits every communicator into one of the same members instead: a new communicator either way,
  // the parents aborted.
  std::vector<int> excluded_ranks = excluded;
  std::vector<size_t> kept;
  for (size_t t = 0; t < impl_->comms.size(); ++t) {
    if (!is_excluded(impl_->first_rank + static_cast<int>(t))) kept.push_back(t);
  }
  shrunk->logical.reserve(kept.size());
  for (size_t t : kept) shrunk->logical.push_back(impl_->logical[t]);
  shrunk->comms.assign(kept.size(), nullptr);
  // The survivors' communicators shrink together; one thread drives this process's, so in one NCCL group.
  DPE_NCCL_CHECK(ncclGroupStart());
  for (size_t k = 0; k < kept.size(); ++k) {
    cuda::DeviceGuard guard(impl_->logical[kept[k]]);
    const int rank = impl_->first_rank + static_cast<int>(kept[k]);
    const ncclResult_t status =
        excluded_ranks.empty()
            ? ncclCommSplit(impl_->comms[kept[k]], 0, rank, &shrunk->comms[k], nullptr)
            : ncclCommShrink(impl_->comms[kept[k]], excluded_ranks.data(), static_cast<int>(excluded_ranks.size()),
                             &shrunk->comms[k], nullptr, NCCL_SHRINK_ABORT);
    if (status != ncclSuccess) {
      ncclGroupEnd();
      DPE_NCCL_CHECK(status);
    }
  }
  DPE_NCCL_CHECK(ncclGroupEnd());
  // The parent communicators, the excluded members' included, are done: abort rather than destroy (destroy
  // would wait for work a failed device may never finish).
  abort("the group was shrunk (ncclCommShrink)");
  return std::unique_ptr<NcclComms>(new NcclComms(std::move(shrunk)));
}

void NcclComms::abort(const std::string& why) {
  if (impl_->aborted.empty()) impl_->aborted.assign(impl_->comms.size(), "");
  for (size_t t = 0; t < impl_->comms.size(); ++t) {
    if (!impl_->aborted[t].empty()) continue;
    impl_->aborted[t] = why;
    ncclCommAbort(impl_->comms[t]);  // its status is of no use: the communicator is gone either way
  }
}

NcclComms::~NcclComms() {
  for (size_t t = 0; t < impl_->comms.size(); ++t) {
    // A destructor reports nothing; an aborted communicator is already gone.
    if (impl_->aborted.empty() || impl_->aborted[t].empty()) ncclCommDestroy(impl_->comms[t]);
    if (!impl_->done.empty() && impl_->done[t] != nullptr) cudaEventDestroy(impl_->done[t]);
  }
}

void NcclComms::wait(int rank, std::chrono::steady_clock::time_point deadline,
                     const std::function<std::string()>& failed_elsewhere, const std::string& what) {
  if (impl_->done.empty()) impl_->done.assign(impl_->comms.size(), nullptr);
  if (impl_->aborted.empty()) impl_->aborted.assign(impl_->comms.size(), "");
  DPE_CHECK_WITH(ErrorKind::Aborted, impl_->aborted[rank].empty(), what,
                 ": the NCCL communicator was aborted by an earlier failure: ", impl_->aborted[rank]);
  const int logical = impl_->logical[rank];
  cuda::DeviceGuard guard(logical);
  cudaEvent_t& done = impl_->done[rank];
  if (done == nullptr) DPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  DPE_CUDA_CHECK(cudaEventRecord(done, cuda::stream(logical)));
  std::string failure;
  ErrorKind kind = ErrorKind::InvalidArgument;  // NCCL's own error: neither a timeout nor an abort
  const auto patient_after = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  for (;;) {
    const cudaError_t state = cudaEventQuery(done);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) DPE_CUDA_CHECK(state);
    ncclResult_t async = ncclSuccess;
    DPE_NCCL_CHECK(ncclCommGetAsyncError(impl_->comms[rank], &async));
    if (async != ncclSuccess) {
      failure = std::string("NCCL reported ") + ncclGetErrorString(async) + ": " + ncclGetLastError(impl_->comms[rank]);
      break;
    }
    if (failure = failed_elsewhere(); !failure.empty()) {
      kind = ErrorKind::Aborted;
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      failure = "did not finish before the group's timeout (a process that stopped calling collectives?)";
      kind = ErrorKind::Timeout;
      break;
    }
    // As MpiComm's waits: back to back (yielding) while it is likely a transfer, then every millisecond.
    if (now < patient_after) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  impl_->aborted[rank] = what + ": " + failure;
  ncclCommAbort(impl_->comms[rank]);  // ends the stuck kernel; its own status is of no further use
  throw Error(impl_->aborted[rank], kind);
}

void NcclComms::all_reduce(int rank, const Tensor& tensor, ReduceOp op) {
  cuda::DeviceGuard guard(impl_->logical[rank]);
  DPE_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                               nccl_type(tensor.dtype()), nccl_op(op), impl_->comms[rank],
                               cuda::stream(impl_->logical[rank])));
}

void NcclComms::broadcast(int rank, const Tensor& tensor, int root) {
  cuda::DeviceGuard guard(impl_->logical[rank]);
  DPE_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                               nccl_type(tensor.dtype()), root, impl_->comms[rank], cuda::stream(impl_->logical[rank])));
}

void NcclComms::reduce(int rank, const Tensor& tensor, int root, ReduceOp op) {
  cuda::DeviceGuard guard(impl_->logical[rank]);
  // NCCL writes the result only on the root; the others' buffers are send-only, as the contract says.
  DPE_NCCL_CHECK(ncclReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                            nccl_type(tensor.dtype()), nccl_op(op), root, impl_->comms[rank],
                            cuda::stream(impl_->logical[rank])));
}

void NcclComms::all_gather(int rank, const Tensor& output, const Tensor& input) {
  cuda::DeviceGuard guard(impl_->logical[rank]);
  DPE_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                               nccl_type(input.dtype()), impl_->comms[rank], cuda::stream(impl_->logical[rank])));
}

void NcclComms::reduce_scatter(int rank, const Tensor& output, const Tensor& input, ReduceOp op) {
  cuda::DeviceGuard guard(impl_->logical[rank]);
  DPE_NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                                   nccl_type(output.dtype()), nccl_op(op), impl_->comms[rank],
                                   cuda::stream(impl_->logical[rank])));
}

}  // namespace dpe
