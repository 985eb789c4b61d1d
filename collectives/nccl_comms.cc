#include "collectives/nccl_comms.h"

#include <nccl.h>

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

struct NcclComms::Impl {
  std::vector<int> logical;
  std::vector<ncclComm_t> comms;
};

NcclComms::NcclComms(const std::vector<int>& logical_devices) : impl_(std::make_unique<Impl>()) {
  impl_->logical = logical_devices;
  std::vector<int> physical;
  for (int d : logical_devices) physical.push_back(cuda::physical_device(d));
  impl_->comms.resize(physical.size());
  DPE_NCCL_CHECK(ncclCommInitAll(impl_->comms.data(), static_cast<int>(physical.size()), physical.data()));
}

NcclComms::~NcclComms() {
  for (ncclComm_t comm : impl_->comms) ncclCommDestroy(comm);  // a destructor reports nothing
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
