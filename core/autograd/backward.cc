#include "core/autograd/backward.h"

#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/autograd/pass_profile.h"
#include "core/autograd/profiler.h"
#include "core/error.h"
#include "core/lost_thread.h"
#include "core/ops.h"

namespace dpe::autograd {

namespace {

struct NewestFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// Number of gradient contributions each node waits for, over the graph reachable from `roots`.
std::unordered_map<Node*, int> count_dependencies(const std::vector<Node*>& roots) {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen(roots.begin(), roots.end());
  std::vector<Node*> stack(roots.begin(), roots.end());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      Node* next = edge.node.get();
      if (next == nullptr) continue;
      ++dependencies[next];
      if (seen.insert(next).second) stack.push_back(next);
    }
  }
  return dependencies;
}

void accumulate(Tensor& slot, const Tensor& grad) {
  if (!grad.defined()) return;
  slot = slot.defined() ? add(slot, grad) : grad;
}

// backward() and grad(): `captured`, when given, maps the leaves whose gradients are returned (their
// AccumulateGrad nodes do not run) to their place in `out`.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                  const std::unordered_map<const TensorImpl*, size_t>* captured, std::vector<Tensor>* out) {
  DPE_CHECK(roots.size() == gradients.size(), "backward: ", roots.size(), " roots but ", gradients.size(),
            " gradients");
  NoGradGuard no_grad;  // backward functions compute plain tensors (no higher-order gradients)

  // Keeps every node alive until the pass ends, and collects the gradients arriving at each node.
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::unordered_map<Node*, std::vector<Tensor>> inputs;
  std::vector<Node*> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    DPE_CHECK(root.defined() && root.requires_grad(), "backward: root ", i,
              " does not require grad and has no grad_fn (was it computed under NoGradGuard, or from tensors "
              "that do not require grad?)");
    Tensor grad = gradients[i];
    if (!grad.defined()) {
      DPE_CHECK(root.numel() == 1, "backward: a gradient must be given for a root with shape ",
                shape_str(root.shape()), " (only one-element roots default to 1)");
      grad = ones(root.shape(), TensorOptions(root.dtype()).with_device(root.device()));
    }
    DPE_CHECK(grad.shape() == root.shape(), "backward: gradient shape ", shape_str(grad.shape()),
              " does not match root shape ", shape_str(root.shape()));
    Edge edge = gradient_edge(root);
    Node* node = edge.node.get();
    owners[node] = edge.node;
    auto& slots = inputs[node];
    slots.resize(node->num_outputs);
    accumulate(slots[edge.input_nr], grad);
    root_nodes.push_back(node);
  }

  std::unordered_map<Node*, int> dependencies = count_dependencies(root_nodes);
  std::priority_queue<Node*, std::vector<Node*>, NewestFirst> ready;
  for (Node* node : std::unordered_set<Node*>(root_nodes.begin(), root_nodes.end())) {
    if (dependencies[node] == 0) ready.push(node);
  }

  std::optional<PassProfile> profile;  // core/autograd/profiler.h
  if (backward_profile_enabled()) profile.emplace();
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grad_outputs = std::move(inputs[node]);
    inputs.erase(node);
    grad_outputs.resize(node->num_outputs);
    if (captured != nullptr) {
      if (const auto* leaf = dynamic_cast<const AccumulateGrad*>(node)) {
        if (auto it = captured->find(leaf->leaf()); it != captured->end()) {
          accumulate((*out)[it->second], grad_outputs[0]);
          continue;
        }
      }
    }
    if (profile) profile->start(*node, grad_outputs);
    std::vector<Tensor> grad_inputs = node->apply(std::move(grad_outputs));
    if (profile) profile->stop();
    checkpoint_if_lost();  // core/lost_thread.h
    DPE_INTERNAL_ASSERT(grad_inputs.empty() || grad_inputs.size() == node->next_edges.size(), node->name(),
                        " returned ", grad_inputs.size(), " gradients for ", node->next_edges.size(), " edges");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      Node* next = edge.node.get();
      if (next == nullptr) continue;
      owners.try_emplace(next, edge.node);
      auto& slots = inputs[next];
      slots.resize(next->num_outputs);
      if (i < grad_inputs.size()) accumulate(slots[edge.input_nr], grad_inputs[i]);
      if (--dependencies[next] == 0) ready.push(next);
    }
    node->release_saved();
  }
  if (profile) profile->finish();
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients) {
  run_backward(roots, gradients, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                         const std::vector<Tensor>& inputs) {
  std::unordered_map<const TensorImpl*, size_t> captured;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DPE_CHECK(inputs[i].defined() && inputs[i].is_leaf() && inputs[i].requires_grad(), "autograd::grad: input ", i,
              " is not a leaf that requires grad");
    captured.emplace(inputs[i].impl(), i);
  }
  std::vector<Tensor> out(inputs.size());
  run_backward(roots, gradients, &captured, &out);
  return out;
}

}  // namespace dpe::autograd
