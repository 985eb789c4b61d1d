#include "core/tensor.h"

#include <algorithm>
#include <iomanip>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "core/autograd/backward.h"
#include "core/autograd/function.h"
#include "core/autograd/grad_mode.h"
#include "core/autograd/node.h"
#include "core/copy.h"
#include "core/error.h"
#include "core/ops.h"

namespace dpe {

// ---------------------------------------------------------------------------------------------------
// helpers

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

namespace {

// channels-last strides of a 4-d shape (N, C, H, W): (H*W*C, 1, W*C, C).
Shape channels_last_strides(const Shape& shape) {
  return {shape[2] * shape[3] * shape[1], 1, shape[3] * shape[1], shape[1]};
}

void check_channels_last_shape(const Shape& shape, const char* what) {
  DPE_CHECK(shape.size() == 4, what, ": channels-last tensors are 4-d (N, C, H, W), got ", shape_str(shape));
}

}  // namespace

// Checked: a product that does not fit in int64 is an error, not a wrapped (possibly negative or small)
// count that a caller would then allocate or index with. A shape with a 0 has 0 elements whatever the rest.
int64_t shape_numel(const Shape& shape) {
  if (std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t s : shape) {
    DPE_CHECK(!__builtin_mul_overflow(n, s, &n), "shape ", shape_str(shape),
              " has more elements than an int64 can count (the product of its sizes overflows)");
  }
  return n;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t rank = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 / -1, like PyTorch
  DPE_CHECK(dim >= -rank && dim < rank, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
            " dimensions (expected ", -rank, "..", rank - 1, ")");
  return dim < 0 ? dim + rank : dim;
}

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

namespace {

void check_shape_valid(const Shape& shape) {
  for (int64_t s : shape) DPE_CHECK(s >= 0, "invalid shape ", shape_str(shape), ": sizes must be >= 0");
  DPE_CHECK(shape.size() <= 8, "shape ", shape_str(shape), " has ", shape.size(),
            " dimensions; dpe supports at most 8");
}

// The bytes of a new contiguous tensor, checked: every size >= 0, the strides (products of sizes, a 0 counted
// as 1) and numel * element size all fit in int64. An unchecked product once wrapped {INT64_MAX, 2} to -2
// elements and a small (or huge) allocation for a tensor that claimed 2^64 elements.
size_t checked_nbytes(const Shape& shape, DType dtype) {
  check_shape_valid(shape);
  int64_t stride = 1;  // what contiguous_strides computes for dimension 0 times its own size
  for (int64_t s : shape) {
    DPE_CHECK(!__builtin_mul_overflow(stride, std::max<int64_t>(s, 1), &stride), "Tensor::empty: shape ",
              shape_str(shape), " is too large: the product of its sizes overflows int64");
  }
  const int64_t numel = shape_numel(shape);
  int64_t nbytes = 0;
  DPE_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(element_size(dtype)), &nbytes),
            "Tensor::empty: shape ", shape_str(shape), " of ", dtype, " is too large: ", numel, " elements of ",
            element_size(dtype), " bytes overflow int64");
  return static_cast<size_t>(nbytes);
}

// A view of `base` with new geometry, sharing storage. Records `backward` when base requires grad.
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset, const char* name,
                 autograd::BackwardFn backward) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->storage_offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = base.dtype();
  impl->device = base.device();
  Tensor view(std::move(impl));
  autograd::record(view, {base}, name, std::move(backward));
  return view;
}

// Refuses in-place writes that would silently corrupt a recorded graph.
void check_inplace_allowed(const Tensor& t, const char* op) {
  DPE_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op, " on a tensor of shape ", shape_str(t.shape()),
            " that requires grad: in-place writes are only allowed under NoGradGuard (e.g. optimizer steps)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// creation and metadata

Tensor Tensor::empty(const Shape& shape, TensorOptions options, MemoryFormat format) {
  Tensor t = empty(shape, options);
  if (format == MemoryFormat::ChannelsLast) {
    check_channels_last_shape(shape, "empty(ChannelsLast)");
    t.impl_->strides = channels_last_strides(shape);  // the same bytes, NHWC order
  }
  return t;
}

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  const size_t nbytes = checked_nbytes(shape, options.dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  impl->device = options.device;
  impl->storage = std::make_shared<Storage>(options.device, nbytes, options.pinned_memory);
  Tensor t(std::move(impl));
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape,
                           std::optional<TensorOptions> maybe_options) {
  TensorOptions options = maybe_options.value_or(TensorOptions(dtype_of<T>()));
  check_shape_valid(shape);
  DPE_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
            " values do not fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  bool requires_grad = options.requires_grad;
  Tensor host = empty(shape, TensorOptions(dtype_of<T>()));
  std::copy(values.begin(), values.end(), host.data<T>());
  Tensor result = empty(shape, options.with_requires_grad(false));
  result.copy_(host);
  if (requires_grad) result.set_requires_grad(true);
  return result;
}

template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<uint8_t>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<Half>&, const Shape&, std::optional<TensorOptions>);
template Tensor Tensor::from_vector(const std::vector<BFloat16>&, const Shape&, std::optional<TensorOptions>);

const TensorImpl& Tensor::checked() const {
  DPE_CHECK(impl_ != nullptr, "operation on an undefined tensor");
  return *impl_;
}

const Shape& Tensor::shape() const { return checked().shape; }
const Shape& Tensor::strides() const { return checked().strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(checked().shape.size()); }
int64_t Tensor::size(int64_t d) const { return checked().shape[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(checked().shape); }
DType Tensor::dtype() const { return checked().dtype; }
const Device& Tensor::device() const { return checked().device; }
int64_t Tensor::storage_offset() const { return checked().storage_offset; }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked().storage; }

bool Tensor::is_pinned() const { return checked().storage->is_pinned(); }

Tensor Tensor::pin_memory() const {
  DPE_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned; this tensor is on ", device());
  if (is_pinned()) return *this;
  Tensor out = empty(shape(), TensorOptions(dtype()).with_device(device()).with_pinned_memory(true));
  copy_into(out, *this);
  autograd::record(out, {*this}, "PinMemoryBackward", [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  return out;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return is_contiguous();
  if (dim() != 4) return false;
  const auto& impl = checked();
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {  // C, W, H, N: innermost first
    if (impl.shape[d] != 1 && impl.strides[d] != expected) return false;
    expected *= impl.shape[d];
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (!is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::Contiguous;
  if (!is_contiguous()) return MemoryFormat::ChannelsLast;
  // In both orders: channels last only if it carries channels-last's strides (contiguous(ChannelsLast) gave it).
  return size(2) * size(3) > 1 && strides() == channels_last_strides(shape()) ? MemoryFormat::ChannelsLast
                                                                              : MemoryFormat::Contiguous;
}

bool Tensor::is_contiguous() const {
  const auto& impl = checked();
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (impl.shape[d] != 1 && impl.strides[d] != expected) return false;
    expected *= impl.shape[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& impl = checked();
  return static_cast<char*>(impl.storage->data()) + impl.storage_offset * element_size(impl.dtype);
}

template <typename T>
T* Tensor::data() const {
  DPE_CHECK(dtype() == dtype_of<T>(), "data<", dtype_name(dtype_of<T>()), ">() on a ", dtype(), " tensor");
  return static_cast<T*>(data_ptr());
}

template float* Tensor::data() const;
template double* Tensor::data() const;
template int64_t* Tensor::data() const;
template int32_t* Tensor::data() const;
template uint8_t* Tensor::data() const;
template Half* Tensor::data() const;
template BFloat16* Tensor::data() const;

// ---------------------------------------------------------------------------------------------------
// views

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = normalize_dim(d, dim(), "narrow");
  int64_t n = shape()[d];
  // length <= n - start rather than start + length <= n: the sum can overflow, the difference cannot.
  if (!(start >= 0 && length >= 0 && start <= n && length <= n - start)) {
    int64_t end = 0;
    const bool wraps = __builtin_add_overflow(start, length, &end);
    DPE_CHECK(false, "narrow: range [", start, ", ", wraps ? detail::str_cat(start, " + ", length) : std::to_string(end),
              ") is outside dimension ", d, " of size ", n, " (shape ", shape_str(shape()), ")");
  }
  Shape new_shape = shape();
  new_shape[d] = length;
  Shape input_shape = shape();
  return make_view(*this, new_shape, strides(), storage_offset() + start * strides()[d], "NarrowBackward",
                   [input_shape, d, start, length](const Tensor& g) -> std::vector<Tensor> {
                     Tensor grad = zeros(input_shape, TensorOptions(g.dtype()).with_device(g.device()));
                     grad.narrow(d, start, length).copy_(g);
                     return {grad};
                   });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  DPE_CHECK(index >= -size(d) && index < size(d), "select: index ", index, " is out of range for dimension ",
            d, " of size ", size(d));
  if (index < 0) index += size(d);
  return narrow(d, index, 1).squeeze(d);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  DPE_CHECK(chunks > 0, "chunk: expected a positive number of chunks, got ", chunks);
  d = normalize_dim(d, dim(), "chunk");
  int64_t n = size(d);
  // ceil(n / chunks) without forming n + chunks - 1 (overflows for a huge chunk count).
  int64_t chunk_size = std::max<int64_t>(n / chunks + (n % chunks != 0), 1);
  std::vector<int64_t> sizes;
  for (int64_t remaining = n; remaining > 0; remaining -= sizes.back()) sizes.push_back(std::min(chunk_size, remaining));
  if (sizes.empty()) sizes.push_back(0);  // chunk of an empty dim: one empty chunk, like PyTorch
  return split(sizes, d);
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t d) const {
  d = normalize_dim(d, dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DPE_CHECK(s >= 0, "split: negative size ", s);
    DPE_CHECK(!__builtin_add_overflow(total, s, &total), "split: sizes ", shape_str(sizes),
              " sum to more than an int64 holds; dimension ", d, " has size ", size(d));
  }
  DPE_CHECK(total == size(d), "split: sizes sum to ", total, " but dimension ", d, " has size ", size(d));
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(d, start, s));
    start += s;
  }
  return parts;
}

namespace {

// Resolves one -1 in `shape` against numel.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape result = shape;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DPE_CHECK(infer_at < 0, op, ": only one dimension can be -1 in ", shape_str(shape));
      infer_at = static_cast<int>(i);
    } else {
      DPE_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in ", shape_str(shape));
      DPE_CHECK(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", shape_str(shape),
                " is invalid for ", numel, " elements (the product of its sizes overflows int64)");
    }
  }
  if (infer_at >= 0) {
    DPE_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for ", numel,
              " elements");
    result[infer_at] = numel / known;
  }
  DPE_CHECK(shape_numel(result) == numel, op, ": shape ", shape_str(shape), " is invalid for input of ", numel,
            " elements");
  return result;
}

// Strides that view `old` geometry as `new_shape` without copying, if they exist (PyTorch's computeStride).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
  // Empty and one-element tensors can take any geometry.
  if (shape_numel(old_shape) <= 1) return contiguous_strides(new_shape);
  Shape new_strides(new_shape.size());
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  Shape new_shape = infer_shape(shape_in, numel(), "view");
  check_shape_valid(new_shape);
  auto strides_opt = view_strides(shape(), strides(), new_shape);
  DPE_CHECK(strides_opt.has_value(), "view: cannot view a tensor of shape ", shape_str(shape()), " and strides ",
            shape_str(strides()), " as ", shape_str(new_shape),
            " without copying; use reshape() or contiguous() first");
  Shape input_shape = shape();
  return make_view(*this, new_shape, *strides_opt, storage_offset(), "ViewBackward",
                   [input_shape](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(input_shape)}; });
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  Shape new_shape = infer_shape(shape_in, numel(), "reshape");
  if (view_strides(shape(), strides(), new_shape).has_value()) return view(new_shape);
  return contiguous().view(new_shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  DPE_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a tensor with ",
            dim(), " dimensions");
  Shape new_shape(dims.size()), new_strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], dim(), "permute");
    DPE_CHECK(inverse[d] == -1, "permute: dimension ", d, " repeats in the permutation");
    inverse[d] = static_cast<int64_t>(i);
    new_shape[i] = shape()[d];
    new_strides[i] = strides()[d];
  }
  return make_view(*this, new_shape, new_strides, storage_offset(), "PermuteBackward",
                   [inverse](const Tensor& g) -> std::vector<Tensor> { return {g.permute(inverse)}; });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = normalize_dim(d0, dim(), "transpose");
  d1 = normalize_dim(d1, dim(), "transpose");
  std::vector<int64_t> dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[d0], dims[d1]);
  return permute(dims);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape new_shape = shape(), new_strides = strides();
  int64_t stride = d < dim() ? strides()[d] * shape()[d] : 1;
  new_shape.insert(new_shape.begin() + d, 1);
  new_strides.insert(new_strides.begin() + d, stride);
  Shape input_shape = shape();
  return make_view(*this, new_shape, new_strides, storage_offset(), "UnsqueezeBackward",
                   [input_shape](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(input_shape)}; });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[d] != 1) return *this;
  Shape new_shape = shape(), new_strides = strides();
  new_shape.erase(new_shape.begin() + d);
  new_strides.erase(new_strides.begin() + d);
  Shape input_shape = shape();
  return make_view(*this, new_shape, new_strides, storage_offset(), "SqueezeBackward",
                   [input_shape](const Tensor& g) -> std::vector<Tensor> { return {g.reshape(input_shape)}; });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = normalize_dim(start_dim, dim(), "flatten");
  end_dim = normalize_dim(end_dim, dim(), "flatten");
  DPE_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape new_shape(shape().begin(), shape().begin() + start_dim);
  int64_t flat = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) flat *= shape()[d];
  new_shape.push_back(flat);
  new_shape.insert(new_shape.end(), shape().begin() + end_dim + 1, shape().end());
  return reshape(new_shape);
}

Tensor Tensor::expand(const Shape& shape_in) const {
  DPE_CHECK(static_cast<int64_t>(shape_in.size()) >= dim(), "expand: target ", shape_str(shape_in),
            " has fewer dimensions than the tensor ", shape_str(shape()));
  size_t lead = shape_in.size() - dim();
  Shape new_shape(shape_in.size()), new_strides(shape_in.size());
  for (size_t i = 0; i < shape_in.size(); ++i) {
    if (i < lead) {
      DPE_CHECK(shape_in[i] >= 0, "expand: size -1 is not allowed in a new leading dimension");
      new_shape[i] = shape_in[i];
      new_strides[i] = 0;
      continue;
    }
    int64_t own = shape()[i - lead];
    int64_t target = shape_in[i] == -1 ? own : shape_in[i];
    DPE_CHECK(target >= 0, "expand: invalid size ", shape_in[i], " in ", shape_str(shape_in),
              " (sizes must be >= 0, or -1 to keep a size)");
    DPE_CHECK(own == target || own == 1, "expand: cannot expand ", shape_str(shape()), " to ",
              shape_str(shape_in), " (dimension ", i, ": ", own, " vs ", target, ")");
    new_shape[i] = target;
    new_strides[i] = own == target ? strides()[i - lead] : 0;
  }
  shape_numel(new_shape);  // throws when the expanded element count overflows int64
  Shape input_shape = shape();
  return make_view(*this, new_shape, new_strides, storage_offset(), "ExpandBackward",
                   [input_shape](const Tensor& g) -> std::vector<Tensor> { return {sum_to(g, input_shape)}; });
}

// ---------------------------------------------------------------------------------------------------
// copies

namespace {

// A differentiable copy of t in `format`.
Tensor copy_in(const Tensor& t, MemoryFormat format) {
  Tensor out = Tensor::empty(t.shape(), TensorOptions(t.dtype()).with_device(t.device()), format);
  copy_into(out, t);
  autograd::record(out, {t}, "CloneBackward", [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  return out;
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return copy_in(*this, MemoryFormat::Contiguous);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return contiguous();
  check_channels_last_shape(shape(), "contiguous(ChannelsLast)");
  if (suggest_memory_format() == MemoryFormat::ChannelsLast) return *this;
  if (is_contiguous(MemoryFormat::ChannelsLast)) {
    // Already NHWC in memory (C = 1 or H = W = 1): the same elements under channels-last's strides.
    return make_view(*this, shape(), channels_last_strides(shape()), storage_offset(), "AliasBackward",
                     [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  }
  return copy_in(*this, MemoryFormat::ChannelsLast);
}

Tensor Tensor::clone() const { return copy_in(*this, suggest_memory_format()); }

Tensor Tensor::to(const Device& target, bool non_blocking) const {
  if (target == device()) return *this;
  check_device_exists(target);
  Tensor out = empty(shape(), TensorOptions(dtype()).with_device(target), suggest_memory_format());
  copy_into(out, *this, non_blocking);
  Device source = device();
  autograd::record(out, {*this}, "ToDeviceBackward",
                   [source](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), TensorOptions(target).with_device(device()), suggest_memory_format());
  copy_into(out, *this);
  DType source = dtype();
  if (is_floating_point(source) && is_floating_point(target)) {
    autograd::record(out, {*this}, "ToDTypeBackward",
                     [source](const Tensor& g) -> std::vector<Tensor> { return {g.to(source)}; });
  }
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace_allowed(*this, "copy_");
  copy_into(*this, src.dim() == dim() && src.shape() == shape() ? src : src.expand(shape()));
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace_allowed(*this, "fill_");
  fill_into(*this, value);
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace_allowed(*this, "add_");
  axpy_into(*this, other, alpha);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_inplace_allowed(*this, "mul_");
  scale_into(*this, value);
  return *this;
}

namespace {
DType compute_dtype(DType t) { return t == DType::Float64 ? DType::Float64 : DType::Float32; }
}  // namespace

Tensor& Tensor::uniform_(double low, double high) {
  check_inplace_allowed(*this, "uniform_");
  NoGradGuard no_grad;
  return copy_(affine(rand(shape(), TensorOptions(compute_dtype(dtype())).with_device(device())), high - low, low));
}

Tensor& Tensor::normal_(double mean, double std) {
  check_inplace_allowed(*this, "normal_");
  NoGradGuard no_grad;
  return copy_(affine(randn(shape(), TensorOptions(compute_dtype(dtype())).with_device(device())), std, mean));
}

// ---------------------------------------------------------------------------------------------------
// host values

double Tensor::item() const {
  DPE_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", shape_str(shape()));
  return to_vector<double>()[0];
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = empty(shape(), TensorOptions(dtype_of<T>()));
  copy_into(host, *this);
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<uint8_t> Tensor::to_vector() const;

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_str(shape()) << ", dtype=" << dtype() << ", device=" << device();
  if (requires_grad()) os << ", requires_grad";
  os << ", values=[";
  std::vector<double> values = to_vector<double>();
  constexpr size_t kShown = 16;
  for (size_t i = 0; i < std::min(values.size(), kShown); ++i) os << (i ? ", " : "") << std::setprecision(6) << values[i];
  if (values.size() > kShown) os << ", ... (" << values.size() << " total)";
  os << "])";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---------------------------------------------------------------------------------------------------
// autograd

bool Tensor::requires_grad() const {
  const auto& impl = checked();
  return impl.autograd != nullptr && (impl.autograd->requires_grad || impl.autograd->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  DPE_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad (this tensor comes from ",
            grad_fn()->name(), "); use detach() first");
  DPE_CHECK(!requires_grad || is_floating_point(dtype()), "set_requires_grad(true) on a ", dtype(),
            " tensor: only floating-point tensors can require gradients");
  autograd::meta_of(*this).requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& impl = checked();
  return impl.autograd == nullptr || impl.autograd->grad_fn == nullptr;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const auto& impl = checked();
  return impl.autograd ? impl.autograd->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    DPE_CHECK(grad.shape() == shape() && grad.device() == device() && grad.dtype() == dtype(),
              "set_grad: gradient ", shape_str(grad.shape()), " ", grad.dtype(), " on ", grad.device(),
              " does not match tensor ", shape_str(shape()), " ", dtype(), " on ", device());
  }
  auto& meta = autograd::meta_of(*this);
  std::lock_guard lock(meta.mutex);
  meta.grad = grad;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const auto& impl = checked();
  return impl.autograd ? impl.autograd->grad_fn : kNone;
}

void Tensor::backward(const Tensor& gradient) const { autograd::backward({*this}, {gradient}); }

Tensor Tensor::detach() const {
  const auto& impl = checked();
  auto copy = std::make_shared<TensorImpl>();
  copy->storage = impl.storage;
  copy->storage_offset = impl.storage_offset;
  copy->shape = impl.shape;
  copy->strides = impl.strides;
  copy->dtype = impl.dtype;
  copy->device = impl.device;
  return Tensor(std::move(copy));
}

void Tensor::set_data(const Tensor& new_data) const {
  DPE_CHECK(new_data.defined(), "set_data: undefined tensor");
  DPE_CHECK(is_leaf(), "set_data: only leaf tensors can take new data");
  checked();
  TensorImpl& impl = *impl_;
  const TensorImpl& src = *new_data.impl();
  impl.storage = src.storage;
  impl.storage_offset = src.storage_offset;
  impl.shape = src.shape;
  impl.strides = src.strides;
  impl.dtype = src.dtype;
  impl.device = src.device;
}

int64_t Tensor::register_post_accumulate_grad_hook(GradHook hook) {
  DPE_CHECK(is_leaf() && requires_grad(),
            "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate gradients");
  auto& meta = autograd::meta_of(*this);
  std::lock_guard lock(meta.mutex);
  int64_t handle = meta.next_hook_handle++;
  meta.hooks.emplace_back(handle, std::move(hook));
  return handle;
}

void Tensor::remove_post_accumulate_grad_hook(int64_t handle) {
  auto& meta = autograd::meta_of(*this);
  std::lock_guard lock(meta.mutex);
  std::erase_if(meta.hooks, [handle](const auto& entry) { return entry.first == handle; });
}

}  // namespace dpe
