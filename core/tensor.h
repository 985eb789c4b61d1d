// Tensor: a strided view of a Storage on one device, with autograd metadata.
//
// Ownership: Tensor is a shared handle (copying a Tensor copies the handle, not the data; use clone()).
// Views (narrow, chunk, view/reshape of contiguous data, transpose, expand, ...) share storage with their base.
// Thread-safety: a Tensor may be read from several threads; mutating the same tensor from two threads at
// once is a data race, except gradient accumulation into a leaf's .grad, which is locked (DP replicas on
// different worker threads may run backward at the same time).
//
// Differentiable operations are free functions in core/ops.h; the methods here that take part in autograd
// (views, to, contiguous, clone, ...) say so.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace dpe {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3]"

// Note [Memory formats]
// PyTorch's memory formats of 4-d (N, C, H, W) tensors. A layout, never a value: every op gives the same values
// whichever it is handed. Contiguous: NCHW in memory. ChannelsLast: the channels of a pixel next to each other
// (NHWC in memory, strides (H*W*C, 1, W*C, C)), the layout oneDNN's CPU convolutions compute in; conv2d, the
// 2x2 max-pool, batch_norm, the activations and binary ops compute in it on CPU, so a channels-last CNN runs
// without relayouts between its layers; the other 4-d ops compute on NCHW copies and hand channels-last results
// back (docs/LAYERS.md, "Channels last"). Like PyTorch, the input decides: convert it with
// contiguous(MemoryFormat::ChannelsLast), and copies (clone, to) keep the format they are given.
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu(0);
  bool requires_grad = false;
  bool pinned_memory = false;  // page-locked host memory (CPU devices only; core/pinned_memory.h)

  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}     // NOLINT: implicit, like PyTorch's TensorOptions
  TensorOptions(Device d) : device(d) {}   // NOLINT
  TensorOptions with_dtype(DType t) const { auto o = *this; o.dtype = t; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
  TensorOptions with_pinned_memory(bool p) const { auto o = *this; o.pinned_memory = p; return o; }
};

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (defined() == false)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation (see also core/ops.h: zeros, ones, full, arange, rand, randn) ----
  static Tensor empty(const Shape& shape, TensorOptions options = {});
  // ChannelsLast: shape must be 4-d (N, C, H, W); the strides are (H*W*C, 1, W*C, C).
  static Tensor empty(const Shape& shape, TensorOptions options, MemoryFormat format);
  // Copies `values` (row-major) into a new tensor of `shape`; the element count must match. Without
  // options the tensor has T's dtype on cpu:0 (like torch::tensor); with options, their dtype and device.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            std::optional<TensorOptions> options = std::nullopt);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t numel() const;
  DType dtype() const;
  const Device& device() const;
  int64_t storage_offset() const;
  bool is_contiguous() const;
  // ChannelsLast: 4-d with the memory in NHWC order (strides of size-1 dims do not count, as in PyTorch).
  bool is_contiguous(MemoryFormat format) const;
  // ChannelsLast for a 4-d tensor in NHWC order that is not also in NCHW order, or that is in both (C = 1 or
  // H = W = 1: the same memory either way) with channels-last's own strides; else Contiguous.
  MemoryFormat suggest_memory_format() const;
  bool is_pinned() const;  // in pinned host memory (core/pinned_memory.h)
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;
  // Same storage region (used to detect aliasing).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // Pointer to the first element (storage + offset). data<T>() checks that T matches dtype().
  void* data_ptr() const;
  template <typename T>
  T* data() const;

  // ---- views (share storage; differentiable) ----
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  // PyTorch's chunk rule: chunk size ceil(size/chunks), the last smaller, possibly fewer than `chunks`.
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  Tensor view(const Shape& shape) const;     // requires compatible strides; one -1 allowed
  Tensor reshape(const Shape& shape) const;  // view if possible, else a contiguous copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;  // only if that dim has size 1
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor expand(const Shape& shape) const;  // broadcast view (stride 0); -1 keeps a size

  // ---- copies (differentiable) ----
  Tensor contiguous() const;  // self if already contiguous
  // Self if suggest_memory_format() is already `format`; else a copy in it (ChannelsLast: 4-d tensors only).
  // Memory already in NHWC order (C = 1, say) is not copied: the result is a view of it with channels-last's
  // strides, so that suggest_memory_format() and the ops see the format.
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;  // in the source's suggest_memory_format(), as to() below
  // Self if already there. non_blocking (PyTorch's): a copy from pinned memory to a CUDA device is only
  // enqueued on the device's stream, and the call returns at once; kernels enqueued later on that device see
  // the data, and the pinned block is not reused before the copy has read it, but writing to the source
  // before then races with the copy. Every other copy returns when it is done, as without non_blocking.
  Tensor to(const Device& device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;           // self if already that dtype
  // A copy in pinned host memory (self if already pinned), for fast and non_blocking copies to CUDA devices.
  // CPU tensors only; throws when pinned memory is unavailable (no CUDA device), naming the reason.
  Tensor pin_memory() const;

  // ---- in-place (not differentiable; refused on tensors that require grad while grad mode is on) ----
  Tensor& copy_(const Tensor& src);  // any devices, any dtypes; src broadcast to self's shape
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // self += alpha * other (same shape)
  Tensor& mul_(double value);
  Tensor& uniform_(double low = 0.0, double high = 1.0);  // from the device's default generator
  Tensor& normal_(double mean = 0.0, double std = 1.0);

  // ---- values back on the host ----
  double item() const;  // one-element tensors
  template <typename T>
  std::vector<T> to_vector() const;  // row-major copy, on the host, converted to T
  std::string str() const;           // readable dump (shape, dtype, device, values)

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);  // leaves only
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad) const;  // handle semantics: changes the shared impl
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Runs backward from this tensor; `gradient` defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = {}) const;
  // A tensor sharing storage but cut off from the graph.
  Tensor detach() const;
  // Makes this tensor (and every handle to it) use new_data's storage, geometry, dtype and device, keeping
  // its autograd identity (requires_grad, hooks); PyTorch's `param.data = new_data`. Module::to and replica
  // synchronisation use it so that handles held by modules and optimizers stay valid.
  void set_data(const Tensor& new_data) const;
  // Called on the backward thread right after a gradient was accumulated into this leaf's .grad
  // (PyTorch's register_post_accumulate_grad_hook). The DDP reducer uses it. Returns a handle.
  using GradHook = std::function<void(const Tensor& leaf)>;
  int64_t register_post_accumulate_grad_hook(GradHook hook);
  void remove_post_accumulate_grad_hook(int64_t handle);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  const TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Implementation state; public so that ops and autograd can build tensors, not part of the user API.
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t storage_offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::Float32;
  Device device;
  std::unique_ptr<autograd::AutogradMeta> autograd;  // null until the tensor takes part in autograd

  TensorImpl();
  ~TensorImpl();
};

// Wraps normalised-dim handling: returns dim in [0, ndim), throwing with the tensor's shape otherwise.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

// Contiguous strides of a shape.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// Maps C++ element types to DType.
template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<Half>() { return DType::Float16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BFloat16; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }

}  // namespace dpe
