// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): 28x28 grey-scale images of clothing in 10 classes, 60000 for
// training and 10000 for testing, read from the four gzip-compressed IDX files that Debian's
// `dataset-fashion-mnist` installs in /usr/share/datasets/fashion-mnist (data/idx_reader.h).
//
//   data::Dataset train = data::load_fashion_mnist(data::kFashionMnistDir, data::Split::Train);
//   // train.images: (60000, 1, 28, 28) float32 on cpu:0, normalised; train.labels: (60000) int64 in [0, 10)
//
// Validation (every failure a dpe::Error naming the file): each file is a regular file (a FIFO is refused
// without waiting for a writer), its magic number, header and exact payload length, trailing data found
// without reading it (data/idx_reader.h); images are 28x28, checked right after their header, before the
// payload is read; the image and label files hold the same number of items; every label is below 10. A
// missing file says how to install the data set.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace dpe::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr int64_t kFashionMnistSide = 28;
// Per-pixel statistics of the training images scaled to [0, 1] (the values torchvision examples use).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

enum class Split { Train, Test };  // train-*.gz (60000 items), t10k-*.gz (10000 items)

// The files load_fashion_mnist reads from its directory: a split's images then its labels, Train then Test.
inline constexpr std::array<const char*, 4> kFashionMnistFiles = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

struct Dataset {
  Tensor images;  // (N, 1, 28, 28) float32 on cpu:0: (pixel / 255 - kFashionMnistMean) / kFashionMnistStd
  Tensor labels;  // (N) int64 on cpu:0, class indices in [0, 10)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct FashionMnistOptions {
  // Read only the first `limit` samples of the split (all when < 0); for fast tests. The files are then
  // not read to their end, so trailing data goes unnoticed (the headers' counts are still compared).
  int64_t limit = -1;
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir`.
Dataset load_fashion_mnist(const std::string& dir, Split split, const FashionMnistOptions& options = {});

// "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot".
const char* fashion_mnist_class_name(int64_t label);

}  // namespace dpe::data
