#include "collectives/shared_memory_backend.h"

#include <algorithm>

#include "core/copy.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "core/kernels/reduce.h"

namespace dpe::collectives {

namespace {

kernels::AxisReduction axis_reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return kernels::AxisReduction::Sum;
    case ReduceOp::Avg: return kernels::AxisReduction::Mean;
    case ReduceOp::Max: return kernels::AxisReduction::Max;
    case ReduceOp::Min: return kernels::AxisReduction::Min;
  }
  DPE_INTERNAL_ASSERT(false, "unknown ReduceOp ", static_cast<int>(op));
  return kernels::AxisReduction::Sum;
}

}  // namespace

std::unique_ptr<Backend> make_shared_memory_backend(const std::vector<Device>& devices) {
  return std::make_unique<SharedMemoryBackend>(devices);
}

void SharedMemoryBackend::copy(const Tensor& dst, const Tensor& src) const {
  if (dst.numel() == 0 || (dst.data_ptr() == src.data_ptr() && dst.device() == src.device())) return;
  copy_into(dst.view({-1}), src.view({-1}));
}

std::vector<Tensor> SharedMemoryBackend::share_of_every_tensor(int rank, const PostedAll& posted) const {
  const Tensor& mine = posted[rank]->tensor;  // validated: every member's has this count and dtype
  auto [begin, end] = work_range(mine.numel(), element_size(mine.dtype()), size(), rank, shares_);
  std::vector<Tensor> slices;
  if (begin == end) return slices;
  for (const Posted* p : posted) slices.push_back(flat_slice(p->tensor, begin, end));
  return slices;
}

void SharedMemoryBackend::combine(int rank, const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs,
                                  ReduceOp op) const {
  if (srcs[0].numel() == 0) return;
  if (devices_[rank].is_cpu()) {
    std::vector<const void*> in;
    std::vector<void*> out;
    for (const Tensor& s : srcs) in.push_back(s.data_ptr());
    for (const Tensor& d : dsts) out.push_back(d.data_ptr());
    reduce_buffers_cpu(srcs[0].dtype(), op, in, out, srcs[0].numel());
    return;
  }
  // Peer copies: stage every source on this member's device, reduce there, copy the result out.
  const Device& here = devices_[rank];
  std::vector<Tensor> staged;
  std::vector<const void*> in;
  for (const Tensor& s : srcs) {
    staged.push_back(s.device() == here ? s.contiguous() : s.to(here));
    in.push_back(staged.back().data_ptr());
  }
  Tensor result = Tensor::empty({srcs[0].numel()}, TensorOptions(srcs[0].dtype()).with_device(here));
  dispatch(
      here, [] { DPE_INTERNAL_ASSERT(false, "CPU members reduce in host memory"); },
      [&](auto stream) {
        kernels::reduce_buffers_cuda(stream, axis_reduction(op), result.dtype(), in, result.numel(), result.data_ptr());
      });
  for (const Tensor& d : dsts) copy_into(d.view({-1}), result);
}

void SharedMemoryBackend::all_reduce(int rank, const PostedAll& posted) {
  std::vector<Tensor> slices = share_of_every_tensor(rank, posted);
  if (!slices.empty()) combine(rank, slices, slices, posted[rank]->op);
}

void SharedMemoryBackend::all_reduce_into(int rank, const PostedAll& posted) {
  const Posted& mine = *posted[rank];
  const DType dtype = mine.tensor.dtype();
  const auto bytes = static_cast<int64_t>(element_size(dtype));
  auto [begin, end] = work_range(mine.tensor.numel(), element_size(dtype), size(), rank, shares_);
  std::vector<double> scales;
  for (const Posted* p : posted) scales.push_back(p->scale);
  std::vector<const void*> in(posted.size());
  std::vector<void*> out(posted.size());
  // Piece i covers the same elements [piece_begin, piece_end) of every member's output (validated).
  int64_t piece_begin = 0;
  for (size_t i = 0; i < mine.list.size() && piece_begin < end; ++i) {
    const int64_t piece_end = piece_begin + mine.list[i].numel();
    const int64_t lo = std::max(begin, piece_begin), hi = std::min(end, piece_end);
    if (lo < hi) {
      for (size_t m = 0; m < posted.size(); ++m) {
        in[m] = static_cast<const char*>(posted[m]->list[i].data_ptr()) + (lo - piece_begin) * bytes;
        out[m] = static_cast<char*>(posted[m]->tensor.data_ptr()) + lo * bytes;
      }
      weighted_sum_buffers_cpu(dtype, in, scales, out, static_cast<size_t>(rank), hi - lo);
    }
    piece_begin = piece_end;
  }
}

void SharedMemoryBackend::broadcast(int rank, const PostedAll& posted) {
  int root = posted[rank]->root;
  if (rank != root) copy(posted[rank]->tensor, posted[root]->tensor);
}

void SharedMemoryBackend::reduce(int rank, const PostedAll& posted) {
  std::vector<Tensor> slices = share_of_every_tensor(rank, posted);
  if (!slices.empty()) combine(rank, {slices[posted[rank]->root]}, slices, posted[rank]->op);
}

void SharedMemoryBackend::all_gather(int rank, const PostedAll& posted) {
  const std::vector<Tensor>& outputs = posted[rank]->list;
  for (int k = 0; k < size(); ++k) copy(outputs[k], posted[k]->tensor);
}

void SharedMemoryBackend::reduce_scatter(int rank, const PostedAll& posted) {
  std::vector<Tensor> mine_from_each;
  for (const Posted* p : posted) mine_from_each.push_back(p->list[rank]);
  // In place (output is this member's own slice of its input): the kernel reads before it writes.
  combine(rank, {posted[rank]->tensor}, mine_from_each, posted[rank]->op);
}

void SharedMemoryBackend::all_gather_into_tensor(int rank, const PostedAll& posted) {
  DPE_INTERNAL_ASSERT(false, "the shared-memory backend serves all_gather_into_tensor as all_gather");
}

void SharedMemoryBackend::reduce_scatter_tensor(int rank, const PostedAll& posted) {
  DPE_INTERNAL_ASSERT(false, "the shared-memory backend serves reduce_scatter_tensor as reduce_scatter");
}

void SharedMemoryBackend::gather(int rank, const PostedAll& posted) {
  copy(posted[posted[rank]->root]->list[rank], posted[rank]->tensor);
}

void SharedMemoryBackend::scatter(int rank, const PostedAll& posted) {
  copy(posted[rank]->tensor, posted[posted[rank]->root]->list[rank]);
}

void SharedMemoryBackend::all_to_all(int rank, const PostedAll& posted) {
  const std::vector<Tensor>& outputs = posted[rank]->list2;
  for (int k = 0; k < size(); ++k) copy(outputs[k], posted[k]->list[rank]);
}

std::vector<uint8_t> SharedMemoryBackend::broadcast_object(int rank, const PostedAll& posted) {
  return posted[posted[rank]->root]->bytes;
}

}  // namespace dpe::collectives
