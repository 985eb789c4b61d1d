// broadcast_coalesced / reduce_add_coalesced (PyTorch's torch.cuda.comm names) over byte-capped buckets.
//
// Tensors are grouped in list order into buckets of one dtype and at most `bucket_bytes` (a larger tensor
// is a bucket of its own). Between CUDA devices each bucket is packed into one flat buffer and crosses the
// link once per destination; between CPU devices (shared host memory) tensors are copied directly, since
// packing would only add a copy.
//
// The `_into` forms write into existing tensors (persistent replicas: no allocation per step) and record no
// autograd. The allocating forms are differentiable, like PyTorch's Broadcast / ReduceAddCoalesced functions:
// a broadcast copy's gradient flows back to its source (so the source receives the sum over devices), and
// each input of a reduce-add receives the output's gradient on its own device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dpe {

inline constexpr size_t kDefaultBucketBytes = 10 << 20;  // PyTorch DP's 10 MiB

struct TransferStats {
  int64_t bytes = 0;      // bytes that crossed between devices (CPU<->CPU copies count too)
  int64_t transfers = 0;  // copies issued between devices
  TransferStats& operator+=(const TransferStats& o) {
    bytes += o.bytes;
    transfers += o.transfers;
    return *this;
  }
};

// destinations[k][i] = sources[i] for every k. All sources on one device; destinations[k] are tensors on one
// device each, with the sources' shapes and dtypes.
TransferStats broadcast_coalesced_into(const std::vector<Tensor>& sources,
                                       const std::vector<std::vector<Tensor>>& destinations,
                                       size_t bucket_bytes = kDefaultBucketBytes);

// Overwrite: outputs[i] = sum over k of inputs[k][i]. Accumulate: outputs[i] += that sum (an undefined
// input is skipped: a replica that produced no gradient for a parameter). inputs[k] all on one device each;
// outputs on one device. Summation order is k = 0, 1, ... for every element (deterministic).
enum class ReduceInto { Overwrite, Accumulate };
TransferStats reduce_add_coalesced_into(const std::vector<std::vector<Tensor>>& inputs,
                                        const std::vector<Tensor>& outputs, size_t bucket_bytes = kDefaultBucketBytes,
                                        ReduceInto mode = ReduceInto::Overwrite);

// result[k][i]: sources[i] on devices[k] (a device equal to the sources' returns the sources themselves).
std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& sources,
                                                     const std::vector<Device>& devices,
                                                     size_t bucket_bytes = kDefaultBucketBytes);

// result[i] on `destination` = sum over k of inputs[k][i].
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs, const Device& destination,
                                         size_t bucket_bytes = kDefaultBucketBytes);

// The buckets: index ranges [first, last) into `tensors`.
std::vector<std::pair<size_t, size_t>> plan_buckets(const std::vector<Tensor>& tensors, size_t bucket_bytes);

}  // namespace dpe
