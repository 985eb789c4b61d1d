#include "data/fashion_mnist.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "data/idx_reader.h"
#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::idx_bytes;
using testing::test_dir;
using testing::write_gz;

// ---- the real data set (Debian's dataset-fashion-mnist, installed by tools/setup.sh) ----
// These tests fail, never skip, when the files are missing: the error says how to install them.

std::vector<int64_t> histogram(const Tensor& labels) {
  std::vector<int64_t> counts(kFashionMnistClasses, 0);
  for (int64_t y : labels.to_vector<int64_t>()) ++counts.at(y);
  return counts;
}

// Mean and standard deviation (population) of every element, in double.
std::pair<double, double> moments(const Tensor& t) {
  const float* x = t.data<float>();
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    sum += x[i];
    sum_sq += double{x[i]} * x[i];
  }
  const double mean = sum / t.numel();
  return {mean, std::sqrt(sum_sq / t.numel() - mean * mean)};
}

TEST(FashionMnistReal, TrainSplit) {
  Dataset train = load_fashion_mnist(kFashionMnistDir, Split::Train);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.images.dtype(), DType::Float32);
  EXPECT_EQ(train.images.device(), Device::cpu(0));
  EXPECT_EQ(train.labels.shape(), (Shape{60000}));
  EXPECT_EQ(train.labels.dtype(), DType::Int64);
  EXPECT_EQ(histogram(train.labels), std::vector<int64_t>(10, 6000));

  const int64_t first = train.labels.data<int64_t>()[0];
  EXPECT_EQ(first, 9);
  EXPECT_STREQ(fashion_mnist_class_name(first), "Ankle boot");

  // kFashionMnistMean/Std are the training set's pixel statistics (0.28604, 0.35302 to five places), so the
  // normalised training images have mean ~0 and standard deviation ~1.
  auto [mean, std] = moments(train.images);
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(std, 1.0, 2e-3);
  // Pixels are whole numbers / 255: the smallest value is pixel 0.
  EXPECT_FLOAT_EQ(train.images.data<float>()[0], static_cast<float>(-kFashionMnistMean / kFashionMnistStd));

  // limit reads the same first samples.
  Dataset head = load_fashion_mnist(kFashionMnistDir, Split::Train, {.limit = 100});
  EXPECT_EQ(head.images.shape(), (Shape{100, 1, 28, 28}));
  EXPECT_EQ(head.labels.to_vector<int64_t>(), train.labels.narrow(0, 0, 100).to_vector<int64_t>());
  EXPECT_EQ(head.images.to_vector<float>(), train.images.narrow(0, 0, 100).to_vector<float>());
}

TEST(FashionMnistReal, TestSplit) {
  Dataset test = load_fashion_mnist(kFashionMnistDir, Split::Test);
  EXPECT_EQ(test.images.shape(), (Shape{10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.shape(), (Shape{10000}));
  EXPECT_EQ(histogram(test.labels), std::vector<int64_t>(10, 1000));
  // The test images come from the same distribution: roughly, not exactly, normalised.
  auto [mean, std] = moments(test.images);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std, 1.0, 0.02);
}

TEST(FashionMnistReal, ClassNames) {
  EXPECT_STREQ(fashion_mnist_class_name(0), "T-shirt/top");
  EXPECT_STREQ(fashion_mnist_class_name(9), "Ankle boot");
  EXPECT_NE(error_of([] { fashion_mnist_class_name(10); }).find("label 10 is out of range"), std::string::npos);
}

// ---- small, hand-made data sets in a temporary directory ----

struct FakeSplit {
  std::vector<uint32_t> image_dims = {3, 28, 28};
  std::vector<uint8_t> pixels = std::vector<uint8_t>(3 * 28 * 28, 0);
  uint32_t image_magic = kIdxImagesMagic;
  std::vector<uint8_t> labels = {1, 0, 9};
};

// Writes train-{images,labels} into a fresh directory and returns it.
std::string write_split(const FakeSplit& s) {
  const std::string dir = test_dir();
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_bytes(s.image_magic, s.image_dims, s.pixels));
  write_gz(dir + "/train-labels-idx1-ubyte.gz",
           idx_bytes(kIdxLabelsMagic, {static_cast<uint32_t>(s.labels.size())}, s.labels));
  return dir;
}

std::string load_error(const std::string& dir) {
  return error_of([&] { load_fashion_mnist(dir, Split::Train); });
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' in: " << message;
}

TEST(FashionMnistFiles, SmallValidSplitAndNormalisation) {
  FakeSplit s;
  s.pixels[0] = 255;
  s.pixels[28 * 28] = 51;  // first pixel of image 1: 0.2
  const std::string dir = write_split(s);
  Dataset d = load_fashion_mnist(dir + "/", Split::Train);  // a trailing slash is fine
  EXPECT_EQ(d.images.shape(), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(d.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 9}));
  const float* x = d.images.data<float>();
  EXPECT_FLOAT_EQ(x[0], static_cast<float>((1.0 - 0.2860) / 0.3530));
  EXPECT_FLOAT_EQ(x[1], static_cast<float>((0.0 - 0.2860) / 0.3530));
  EXPECT_FLOAT_EQ(x[28 * 28], static_cast<float>((0.2 - 0.2860) / 0.3530));

  Dataset head = load_fashion_mnist(dir, Split::Train, {.limit = 2});
  EXPECT_EQ(head.images.shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(head.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
}

TEST(FashionMnistFiles, MissingFileSaysHowToInstall) {
  const std::string dir = test_dir();
  const std::string message = load_error(dir);
  EXPECT_TRUE(message.starts_with("cannot open " + dir + "/train-labels-idx1-ubyte.gz: No such file or "
                                  "directory; install the data set with `apt-get install dataset-fashion-mnist` "
                                  "or pass --data-dir"))
      << message;
  // The test split reads t10k-*.
  expect_contains(error_of([&] { load_fashion_mnist(dir, Split::Test); }),
                  "cannot open " + dir + "/t10k-labels-idx1-ubyte.gz");
}

TEST(FashionMnistFiles, BadMagic) {
  FakeSplit s;
  s.image_magic = 0x00000804;  // unsigned bytes with 4 dimensions
  s.image_dims = {3, 1, 28, 28};
  const std::string dir = write_split(s);
  const std::string message = load_error(dir);
  expect_contains(message, dir + "/train-images-idx3-ubyte.gz: bad magic number 2052");
  expect_contains(message, "expected 2051");
}

TEST(FashionMnistFiles, TruncatedPayload) {
  FakeSplit s;
  s.pixels.resize(3 * 28 * 28 - 1);
  const std::string dir = write_split(s);
  const std::string message = load_error(dir);
  expect_contains(message, dir + "/train-images-idx3-ubyte.gz: truncated payload");
  expect_contains(message, "only 2351 bytes");
}

TEST(FashionMnistFiles, TrailingData) {
  FakeSplit s;
  s.pixels.resize(3 * 28 * 28 + 5);
  const std::string dir = write_split(s);
  expect_contains(load_error(dir), dir + "/train-images-idx3-ubyte.gz: trailing data after 3 items");
}

TEST(FashionMnistFiles, CountMismatch) {
  FakeSplit s;
  s.labels = {1, 2};
  const std::string dir = write_split(s);
  const std::string message = load_error(dir);
  expect_contains(message, dir + "/train-images-idx3-ubyte.gz holds 3 images but " + dir +
                               "/train-labels-idx1-ubyte.gz holds 2 labels");
  // limit reads a prefix of both, but the headers' counts still disagree.
  expect_contains(error_of([&] { load_fashion_mnist(dir, Split::Train, {.limit = 1}); }), "holds 3 images");
}

TEST(FashionMnistFiles, WrongImageSize) {
  FakeSplit s;
  s.image_dims = {3, 28, 27};
  s.pixels.resize(3 * 28 * 27);
  const std::string dir = write_split(s);
  expect_contains(load_error(dir), "train-images-idx3-ubyte.gz: images are 28x27; expected 28x28");
}

// Regression: the image size was checked after the payload was read, so 28x29
// images with a short payload failed as "truncated payload". The size is checked right after the header.
TEST(FashionMnistFiles, WrongImageSizeIsFoundBeforeThePayload) {
  FakeSplit s;
  s.image_dims = {3, 28, 29};
  s.pixels.resize(100);  // far less than 3 * 28 * 29
  const std::string dir = write_split(s);
  const std::string message = load_error(dir);
  expect_contains(message, dir + "/train-images-idx3-ubyte.gz: images are 28x29; expected 28x28 (the header's "
                                 "sizes are [3, 28, 29])");
  EXPECT_EQ(message.find("truncated"), std::string::npos) << message;
}

// Regression: a FIFO without a writer in --data-dir blocked forever in open().
TEST(FashionMnistFiles, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string dir = write_split(FakeSplit{});
  const std::string labels = dir + "/train-labels-idx1-ubyte.gz";
  std::filesystem::remove(labels);
  ASSERT_EQ(::mkfifo(labels.c_str(), 0644), 0) << std::strerror(errno);
  auto result = std::async(std::launch::async, [&] { return load_error(dir); });
  if (result.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "load_fashion_mnist blocked on a FIFO without a writer";
    const int fd = ::open(labels.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked open() return
    if (fd >= 0) ::close(fd);
  }
  expect_contains(result.get(), "cannot read " + labels + ": it is a FIFO (named pipe), not a regular file; "
                                "expected an IDX file; install the data set");
}

TEST(FashionMnistFiles, LabelOutOfRange) {
  FakeSplit s;
  s.labels = {1, 10, 2};
  const std::string dir = write_split(s);
  expect_contains(load_error(dir), dir + "/train-labels-idx1-ubyte.gz: label 10 at index 1 is out of range; "
                                         "expected a class in [0, 10)");
}

}  // namespace
}  // namespace dpe::data
