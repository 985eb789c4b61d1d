#include "core/autograd/node.h"

#include "core/allocator.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/storage.h"

namespace dpe::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
// meta_of may be called concurrently for different tensors; creation of one tensor's meta is guarded.
std::mutex meta_creation_mutex;
// True when `t` can be kept as leaf's gradient without a copy: no other handle to it or its storage exists,
// it fills its whole storage contiguously, and it has the leaf's dtype and device and no autograd history.
bool is_sole_owner_of_layout(const Tensor& t, const Tensor& leaf) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous() &&
         t.storage_offset() == 0 && t.nbytes() == t.storage()->nbytes() && t.dtype() == leaf.dtype() &&
         t.device() == leaf.device() && !t.requires_grad();
}

}  // namespace

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1)) {}

AutogradMeta& meta_of(const Tensor& t) {
  TensorImpl* impl = t.impl();
  DPE_CHECK(impl != nullptr, "autograd on an undefined tensor");
  std::lock_guard lock(meta_creation_mutex);
  if (!impl->autograd) impl->autograd = std::make_unique<AutogradMeta>();
  return *impl->autograd;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  auto& meta = meta_of(t);
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  // A leaf: share one accumulator among all graphs that use it while any of them is alive.
  std::lock_guard lock(meta.mutex);
  std::shared_ptr<Node> accumulator = meta.accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.accumulator = accumulator;
  }
  return {accumulator, 0};
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  DPE_INTERNAL_ASSERT(grad_outputs.size() == 1);
  Tensor& incoming = grad_outputs[0];
  if (!incoming.defined()) return {};
  Tensor leaf(leaf_);
  DPE_INTERNAL_ASSERT(incoming.shape() == leaf.shape(), "gradient ", shape_str(incoming.shape()), " for leaf ",
                      shape_str(leaf.shape()));
  auto& meta = *leaf_->autograd;
  std::vector<Tensor::GradHook> hooks;
  {
    std::lock_guard lock(meta.mutex);
    if (!meta.grad.defined()) {
      // The first gradient becomes a contiguous tensor the leaf owns (never an alias of a tensor that the
      // graph or the caller may still modify): the incoming one itself when nothing else can reach it
      // (PyTorch steals it the same way), else a copy.
      // Either way the memory now counts as gradients (core/allocator.h).
      if (is_sole_owner_of_layout(incoming, leaf)) {
        meta.grad = std::move(incoming);
        meta.grad.storage()->set_memory_kind(MemoryKind::Gradients);
      } else {
        MemoryKindGuard kind(MemoryKind::Gradients);
        Tensor owned = Tensor::empty(leaf.shape(), TensorOptions(leaf.dtype()).with_device(leaf.device()));
        owned.copy_(incoming);
        meta.grad = owned;
      }
    } else {
      meta.grad.add_(incoming);
    }
    for (auto& [handle, hook] : meta.hooks) hooks.push_back(hook);
  }
  // Hooks run outside the lock: a hook may read .grad or launch communication.
  for (auto& hook : hooks) hook(leaf);
  return {};
}

}  // namespace dpe::autograd
