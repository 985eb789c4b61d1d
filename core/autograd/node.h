// The recorded graph: a Node per differentiable op application, edges to the nodes that produced its
// inputs. Leaves that require grad end in an AccumulateGrad node.
//
// Contract of Node::apply: given the gradients of the node's outputs (one per output; an undefined Tensor
// means "zero"), return the gradients of its inputs, one per next_edges entry (undefined = no gradient).
// Parameter gradients accumulate (+=) into .grad; activation gradients are fresh tensors.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dpe::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  int input_nr = 0;            // which of node's outputs' gradient this edge carries
};

class Node {
 public:
  Node();
  virtual ~Node() = default;

  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors after backward (retain_graph = false); a second backward then fails clearly.
  // A node shared by concurrent graphs (a leaf's AccumulateGrad) keeps nothing to release.
  virtual void release_saved() {}
  // Whether apply() runs whole backward passes of other graphs itself (DP's gather, which runs every
  // replica's backward): the backward profiler times those passes' nodes, not this one around them.
  virtual bool runs_nested_backward() const { return false; }

  // Monotonic creation order: the engine runs ready nodes newest first, like PyTorch, so the gradient-ready
  // order follows reverse execution order.
  uint64_t sequence_nr() const { return sequence_nr_; }
  int num_outputs = 1;
  std::vector<Edge> next_edges;

 private:
  uint64_t sequence_nr_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                       // leaves: the accumulated gradient
  std::shared_ptr<Node> grad_fn;     // non-leaves: the node that produced this tensor
  int output_nr = 0;                 // which output of grad_fn
  std::weak_ptr<Node> accumulator;   // leaves: the AccumulateGrad node (created on demand)
  std::mutex mutex;                  // guards grad, accumulator and hooks
  std::vector<std::pair<int64_t, Tensor::GradHook>> hooks;
  int64_t next_hook_handle = 0;
};

// Accumulates into a leaf's .grad (+=) and runs its post-accumulate hooks. Thread-safe per leaf.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { num_outputs = 1; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  // The leaf this node accumulates into (DDP's unused-parameter search matches leaves by identity).
  const TensorImpl* leaf() const { return leaf_.get(); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The meta of t, created if missing.
AutogradMeta& meta_of(const Tensor& t);
// The edge through which a gradient for t flows: t's grad_fn, or its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

}  // namespace dpe::autograd
