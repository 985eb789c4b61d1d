#include "data/fashion_mnist.h"

#include <array>

#include "core/error.h"
#include "data/idx_reader.h"

namespace dpe::data {
namespace {

constexpr const char* kInstallHint =
    "install the data set with `apt-get install dataset-fashion-mnist` or pass --data-dir";

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace

Dataset load_fashion_mnist(const std::string& dir, Split split, const FashionMnistOptions& options) {
  const size_t first = split == Split::Train ? 0 : 2;
  const std::string images_path = join_path(dir, kFashionMnistFiles[first]);
  const std::string labels_path = join_path(dir, kFashionMnistFiles[first + 1]);
  // Labels first: the small file, so a missing or mismatched data set fails fast. The images' 28x28 is
  // checked by read_idx right after the header, before their payload is read.
  IdxArray labels = read_idx(labels_path, kIdxLabelsMagic, {.max_items = options.limit, .open_hint = kInstallHint});
  IdxArray images = read_idx(images_path, kIdxImagesMagic,
                             {.max_items = options.limit,
                              .open_hint = kInstallHint,
                              .item_dims = {kFashionMnistSide, kFashionMnistSide},
                              .item_name = "images"});
  DPE_INTERNAL_ASSERT(images.dims[1] == kFashionMnistSide && images.dims[2] == kFashionMnistSide);
  DPE_CHECK(images.file_items == labels.file_items, images_path, " holds ", images.file_items,
            " images but ", labels_path, " holds ", labels.file_items, " labels; expected the same count");
  const int64_t n = labels.dims[0];
  DPE_INTERNAL_ASSERT(images.dims[0] == n);

  // labels: (N) uint8 -> (N) int64
  Tensor label_tensor = Tensor::empty({n}, DType::Int64);
  int64_t* y = label_tensor.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    DPE_CHECK(labels.data[i] < kFashionMnistClasses, labels_path, ": label ", int{labels.data[i]},
              " at index ", i, " is out of range; expected a class in [0, ", kFashionMnistClasses, ")");
    y[i] = labels.data[i];
  }

  // images: (N, 28, 28) uint8 -> (N, 1, 28, 28) float32, (x / 255 - mean) / std = x * scale + shift
  constexpr int64_t kPixels = kFashionMnistSide * kFashionMnistSide;
  Tensor image_tensor = Tensor::empty({n, 1, kFashionMnistSide, kFashionMnistSide}, DType::Float32);
  std::array<float, 256> lut;  // the 256 possible normalised values, computed once in double
  for (int v = 0; v < 256; ++v) {
    lut[v] = static_cast<float>((v / 255.0 - kFashionMnistMean) / kFashionMnistStd);
  }
  float* x = image_tensor.data<float>();
  const uint8_t* pixels = images.data.data();
  for (int64_t i = 0; i < n * kPixels; ++i) x[i] = lut[pixels[i]];

  return Dataset{.images = image_tensor, .labels = label_tensor};
}

const char* fashion_mnist_class_name(int64_t label) {
  static constexpr const char* kNames[kFashionMnistClasses] = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  DPE_CHECK(label >= 0 && label < kFashionMnistClasses, "fashion_mnist_class_name: label ", label,
            " is out of range; expected [0, ", kFashionMnistClasses, ")");
  return kNames[label];
}

}  // namespace dpe::data
