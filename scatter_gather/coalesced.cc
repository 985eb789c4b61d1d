#include "scatter_gather/coalesced.h"

#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {

namespace {

Device common_device(const std::vector<Tensor>& tensors, const char* what) {
  DPE_CHECK(!tensors.empty(), what, ": empty tensor list");
  for (const Tensor& t : tensors) {
    DPE_CHECK(t.defined(), what, ": undefined tensor");
    DPE_CHECK(t.device() == tensors[0].device(), what, ": tensors on ", tensors[0].device(), " and ", t.device(),
              " in one list");
  }
  return tensors[0].device();
}

void check_matching(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const char* what) {
  DPE_CHECK(a.size() == b.size(), what, ": ", a.size(), " tensors vs ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    DPE_CHECK(a[i].shape() == b[i].shape() && a[i].dtype() == b[i].dtype(), what, ": tensor ", i, " is ",
              shape_str(a[i].shape()), " ", a[i].dtype(), " on one side and ", shape_str(b[i].shape()), " ",
              b[i].dtype(), " on the other");
  }
}

// One flat contiguous tensor holding tensors[first, last) back to back, on their device.
Tensor pack(const std::vector<Tensor>& tensors, size_t first, size_t last) {
  int64_t numel = 0;
  for (size_t i = first; i < last; ++i) numel += tensors[i].numel();
  Tensor flat = Tensor::empty({numel}, TensorOptions(tensors[first].dtype()).with_device(tensors[first].device()));
  int64_t offset = 0;
  for (size_t i = first; i < last; ++i) {
    flat.narrow(0, offset, tensors[i].numel()).copy_(tensors[i].reshape({-1}));
    offset += tensors[i].numel();
  }
  return flat;
}

void unpack(const Tensor& flat, const std::vector<Tensor>& tensors, size_t first, size_t last) {
  int64_t offset = 0;
  for (size_t i = first; i < last; ++i) {
    Tensor destination = tensors[i];  // a handle: the write lands in the caller's tensor
    destination.copy_(flat.narrow(0, offset, tensors[i].numel()).view(tensors[i].shape()));
    offset += tensors[i].numel();
  }
}

int64_t bytes_of(const std::vector<Tensor>& tensors, size_t first, size_t last) {
  int64_t bytes = 0;
  for (size_t i = first; i < last; ++i) bytes += static_cast<int64_t>(tensors[i].nbytes());
  return bytes;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> plan_buckets(const std::vector<Tensor>& tensors, size_t bucket_bytes) {
  DPE_CHECK(bucket_bytes > 0, "bucket size must be positive");
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t first = 0, bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t nbytes = tensors[i].nbytes();
    bool new_bucket = i > first && (tensors[i].dtype() != tensors[first].dtype() || bytes + nbytes > bucket_bytes);
    if (new_bucket) {
      buckets.emplace_back(first, i);
      first = i;
      bytes = 0;
    }
    bytes += nbytes;
  }
  if (first < tensors.size()) buckets.emplace_back(first, tensors.size());
  return buckets;
}

TransferStats broadcast_coalesced_into(const std::vector<Tensor>& sources,
                                       const std::vector<std::vector<Tensor>>& destinations, size_t bucket_bytes) {
  NoGradGuard no_grad;
  TransferStats stats;
  if (sources.empty()) return stats;
  Device from = common_device(sources, "broadcast_coalesced");
  auto buckets = plan_buckets(sources, bucket_bytes);
  for (const auto& dst : destinations) {
    check_matching(sources, dst, "broadcast_coalesced");
    Device to = common_device(dst, "broadcast_coalesced");
    if (to == from) continue;
    for (auto [first, last] : buckets) {
      if (from.is_cpu() && to.is_cpu()) {
        for (size_t i = first; i < last; ++i) dst[i].detach().copy_(sources[i]);
        stats.transfers += static_cast<int64_t>(last - first);
      } else {
        unpack(pack(sources, first, last).to(to), dst, first, last);
        stats.transfers += 1;
      }
      stats.bytes += bytes_of(sources, first, last);
    }
  }
  return stats;
}

TransferStats reduce_add_coalesced_into(const std::vector<std::vector<Tensor>>& inputs,
                                        const std::vector<Tensor>& outputs, size_t bucket_bytes, ReduceInto mode) {
  NoGradGuard no_grad;
  TransferStats stats;
  DPE_CHECK(!inputs.empty(), "reduce_add_coalesced: no inputs");
  if (outputs.empty()) return stats;
  Device to = common_device(outputs, "reduce_add_coalesced");
  for (const auto& in : inputs) {
    DPE_CHECK(in.size() == outputs.size(), "reduce_add_coalesced: ", in.size(), " tensors vs ", outputs.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].defined()) continue;
      DPE_CHECK(in[i].shape() == outputs[i].shape() && in[i].dtype() == outputs[i].dtype(), "reduce_add_coalesced: tensor ",
                i, " is ", shape_str(in[i].shape()), " ", in[i].dtype(), " in an input and ", shape_str(outputs[i].shape()),
                " ", outputs[i].dtype(), " in the output");
    }
  }
  for (auto [first, last] : plan_buckets(outputs, bucket_bytes)) {
    std::vector<bool> written(last - first, mode == ReduceInto::Accumulate);
    for (size_t k = 0; k < inputs.size(); ++k) {
      // The defined tensors of this bucket, and where they live.
      std::vector<Tensor> present;
      for (size_t i = first; i < last; ++i) {
        if (inputs[k][i].defined()) present.push_back(inputs[k][i]);
      }
      if (present.empty()) continue;
      Device from = common_device(present, "reduce_add_coalesced");
      bool direct = from == to || (from.is_cpu() && to.is_cpu());
      Tensor flat;  // the bucket's defined inputs packed and moved to the destination (CUDA links only)
      if (!direct) {
        flat = pack(present, 0, present.size()).to(to);
        stats.transfers += 1;
      } else if (from != to) {
        stats.transfers += static_cast<int64_t>(present.size());
      }
      if (from != to) stats.bytes += bytes_of(present, 0, present.size());
      int64_t offset = 0;
      for (size_t i = first; i < last; ++i) {
        if (!inputs[k][i].defined()) continue;
        Tensor out = outputs[i].detach();
        Tensor piece = direct ? inputs[k][i] : flat.narrow(0, offset, out.numel()).view(out.shape());
        offset += out.numel();
        if (written[i - first]) {
          out.add_(piece);
        } else {
          out.copy_(piece);
          written[i - first] = true;
        }
      }
    }
    for (size_t i = first; i < last; ++i) {
      if (!written[i - first]) outputs[i].detach().zero_();  // no input had it: the sum is zero
    }
  }
  return stats;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& sources,
                                                     const std::vector<Device>& devices, size_t bucket_bytes) {
  std::vector<std::vector<Tensor>> result;
  for (const Device& d : devices) {
    if (!sources.empty() && d == sources[0].device()) {
      result.push_back(sources);
      continue;
    }
    std::vector<Tensor> copies;
    for (const Tensor& s : sources) copies.push_back(Tensor::empty(s.shape(), TensorOptions(s.dtype()).with_device(d)));
    result.push_back(copies);
  }
  std::vector<std::vector<Tensor>> others;
  for (size_t k = 0; k < devices.size(); ++k) {
    if (sources.empty() || devices[k] != sources[0].device()) others.push_back(result[k]);
  }
  broadcast_coalesced_into(sources, others, bucket_bytes);
  for (size_t k = 0; k < devices.size(); ++k) {
    if (!sources.empty() && devices[k] == sources[0].device()) continue;  // the sources themselves
    for (size_t i = 0; i < sources.size(); ++i) {
      Device source = sources[i].device();
      autograd::record(result[k][i], {sources[i]}, "BroadcastBackward",
                       [source](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
    }
  }
  return result;
}

std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs, const Device& destination,
                                         size_t bucket_bytes) {
  DPE_CHECK(!inputs.empty(), "reduce_add_coalesced: no inputs");
  std::vector<Tensor> outputs;
  for (const Tensor& t : inputs[0]) outputs.push_back(Tensor::empty(t.shape(), TensorOptions(t.dtype()).with_device(destination)));
  reduce_add_coalesced_into(inputs, outputs, bucket_bytes);
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::vector<Tensor> summands;
    for (const auto& in : inputs) summands.push_back(in[i]);
    autograd::record(outputs[i], summands, "ReduceAddBackward", [summands](const Tensor& g) -> std::vector<Tensor> {
      std::vector<Tensor> grads;
      for (const Tensor& t : summands) grads.push_back(g.to(t.device()));
      return grads;
    });
  }
  return outputs;
}

}  // namespace dpe
