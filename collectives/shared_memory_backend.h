// The shared-memory backend (internal to //collectives): every member reads and writes the other members'
// buffers directly, which one process allows.
//  - CPU devices (backend 'cpu') share the host memory. Every member does its share of the work (an
//    all-reduce reduces 1/n of the elements across all members' buffers and writes the result back into all
//    of them), so a collective runs on n threads near memory bandwidth; the arithmetic is reduce_buffers_cpu.
//  - CUDA devices (backend 'peer-copy', and the NCCL backend's non-NCCL collectives): members pull the slices
//    they own with device-to-device copies and reduce them on their own stream.
// The flat forms (all_gather_into_tensor, reduce_scatter_tensor) are served as the list forms.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/backend.h"

namespace dpe::collectives {

class SharedMemoryBackend : public Backend {
 public:
  explicit SharedMemoryBackend(std::vector<Device> devices) : devices_(std::move(devices)) {}

  FlatForms flat_forms() const override { return FlatForms::AsLists; }

  void all_reduce(int rank, const PostedAll& posted) override;
  // CPU devices: every member reduces its work_range of the pieces of every member (float32, float64).
  bool reduces_pieces_in_place(DType dtype) const override {
    return devices_[0].is_cpu() && (dtype == DType::Float32 || dtype == DType::Float64);
  }
  void all_reduce_into(int rank, const PostedAll& posted) override;
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
  void set_work_shares(const std::vector<double>& shares) override { shares_ = shares; }

 protected:
  int size() const { return static_cast<int>(devices_.size()); }
  // dst = src, element for element (nothing when they are the same buffer or empty).
  void copy(const Tensor& dst, const Tensor& src) const;
  // Member `rank`'s work_range of every member's `tensor`, flat; empty when the range is.
  std::vector<Tensor> share_of_every_tensor(int rank, const PostedAll& posted) const;
  // dsts[m] = op over srcs[k], computed by member `rank` (its device does the arithmetic off the host).
  void combine(int rank, const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs, ReduceOp op) const;

  std::vector<Device> devices_;
  std::vector<double> shares_;  // set_work_shares: normalised, or empty for equal shares
};

std::unique_ptr<Backend> make_shared_memory_backend(const std::vector<Device>& devices);

}  // namespace dpe::collectives
