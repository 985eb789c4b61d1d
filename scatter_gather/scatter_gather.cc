#include "scatter_gather/scatter_gather.h"

#include <atomic>
#include <cstdio>
#include <numeric>

#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {

namespace {

// One node for all chunks of a scatter: its backward is a single gather, not one zero-padded full-size
// gradient per chunk (what composing narrow + to would give).
class ScatterBackward final : public autograd::Node {
 public:
  ScatterBackward(Device source, int64_t dim, std::vector<Shape> chunk_shapes)
      : source_(source), dim_(dim), chunk_shapes_(std::move(chunk_shapes)) {
    num_outputs = static_cast<int>(chunk_shapes_.size());
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> pieces;
    for (size_t i = 0; i < grads.size(); ++i) {
      pieces.push_back(grads[i].defined() ? grads[i].to(source_) : zeros(chunk_shapes_[i], TensorOptions(dtype_of_first(grads)).with_device(source_)));
    }
    return {cat(pieces, dim_)};
  }
  std::string name() const override { return "ScatterBackward"; }

 private:
  static DType dtype_of_first(const std::vector<Tensor>& grads) {
    for (const Tensor& g : grads) {
      if (g.defined()) return g.dtype();
    }
    return DType::Float32;
  }

  Device source_;
  int64_t dim_;
  std::vector<Shape> chunk_shapes_;
};

}  // namespace

std::vector<Tensor> scatter(const Tensor& x, const std::vector<Device>& devices, int64_t dim,
                            const std::vector<int64_t>& chunk_sizes) {
  DPE_CHECK(x.defined(), "scatter: undefined tensor");
  DPE_CHECK(x.dim() > 0, "scatter: cannot split a 0-dim tensor");
  int64_t d = normalize_dim(dim, x.dim(), "scatter");
  DPE_CHECK(chunk_sizes.size() <= devices.size(), "scatter: ", chunk_sizes.size(), " chunks for ", devices.size(),
            " devices");
  int64_t total = std::accumulate(chunk_sizes.begin(), chunk_sizes.end(), int64_t{0});
  DPE_CHECK(total == x.size(d), "scatter: chunk sizes sum to ", total, " but dimension ", d, " has size ", x.size(d),
            " (shape ", shape_str(x.shape()), ")");
  std::vector<Tensor> chunks;
  std::vector<Shape> shapes;
  {
    NoGradGuard no_grad;  // one ScatterBackward node below stands for all these copies
    int64_t offset = 0;
    for (size_t i = 0; i < chunk_sizes.size(); ++i) {
      Tensor piece = x.narrow(d, offset, chunk_sizes[i]);
      // non_blocking, as in PyTorch's scatter: from a pinned batch the copies to CUDA devices are only enqueued.
      chunks.push_back(piece.device() == devices[i] ? piece : piece.to(devices[i], /*non_blocking=*/true));
      shapes.push_back(piece.shape());
      offset += chunk_sizes[i];
    }
  }
  if (autograd::needs_grad({&x})) {
    auto node = std::make_shared<ScatterBackward>(x.device(), d, shapes);
    node->next_edges.push_back(autograd::gradient_edge(x));
    for (size_t i = 0; i < chunks.size(); ++i) {
      // A chunk that is a view of x must not share x's autograd identity: give it its own impl.
      chunks[i] = chunks[i].detach();
      auto& meta = autograd::meta_of(chunks[i]);
      meta.grad_fn = node;
      meta.output_nr = static_cast<int>(i);
    }
  }
  return chunks;
}

Tensor gather(const std::vector<Tensor>& tensors, const Device& output_device, int64_t dim) {
  DPE_CHECK(!tensors.empty(), "gather: no tensors");
  check_device_exists(output_device);
  bool all_scalars = true;
  for (const Tensor& t : tensors) {
    DPE_CHECK(t.defined(), "gather: undefined tensor");
    all_scalars = all_scalars && t.dim() == 0;
  }
  std::vector<Tensor> moved;
  if (all_scalars) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      std::fprintf(stderr,
                   "dpe: warning: was asked to gather along dimension %lld, but all input tensors were scalars; "
                   "will instead unsqueeze and return a vector.\n",
                   static_cast<long long>(dim));
    }
    for (const Tensor& t : tensors) moved.push_back(t.unsqueeze(0).to(output_device));
    return cat(moved, 0);
  }
  const Tensor& first = tensors[0];
  int64_t d = normalize_dim(dim, first.dim(), "gather");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bool same = t.dim() == first.dim();
    for (int64_t k = 0; same && k < t.dim(); ++k) same = k == d || t.size(k) == first.size(k);
    DPE_CHECK(same, "gather: input ", i, " has shape ", shape_str(t.shape()), " but input 0 has ",
              shape_str(first.shape()), "; they may differ only in dimension ", d);
    moved.push_back(t.to(output_device));
  }
  return cat(moved, d);
}

}  // namespace dpe
