// IDX reader: the file format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/), gzip-compressed
// or not (zlib's gzread reads plain files unchanged).
//
//   IdxArray labels = read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", kIdxLabelsMagic);
//   // labels.dims == {10000}, labels.data.size() == 10000
//
// Format: a big-endian uint32 magic number 0x0000TTDD (TT = element type, 0x08 for unsigned bytes;
// DD = the number of dimensions), DD big-endian uint32 sizes, then prod(sizes) elements, row-major, and
// nothing after them. Only unsigned bytes are read (the magic numbers below).
//
// Validation, every failure a dpe::Error naming the file: the file opens and is a regular file (a directory,
// FIFO, device or socket is refused by what it is; a FIFO is opened without waiting for a writer); the magic
// number is the expected one; the header is complete; every size is >= 0 and their product is at most 2^40
// bytes; the items' sizes are the expected ones (IdxReadOptions::item_dims), checked right after the header;
// the payload the header promises fits in the file (its size on disk when plain, 1032 times it when gzip:
// deflate's largest ratio), checked before anything is allocated; the payload holds exactly prod(sizes)
// bytes: a short payload is an error, and so is trailing data, found by reading one byte past the payload,
// never more (a gzip bomb or a sparse 20 GB file after a valid payload fails at once); the gzip stream is
// intact (zlib's CRC and length checks at its end). Memory grows with the data actually read; running out is
// an error naming the sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpe::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // 2051: unsigned bytes, 3 dimensions (N, rows, cols)
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // 2049: unsigned bytes, 1 dimension (N)

struct IdxReadOptions {
  // Read only the first max_items items along dimension 0 (all when < 0). The file is then not read to
  // its end, so trailing data and a damaged gzip tail go unnoticed; a short payload is still an error.
  int64_t max_items = -1;
  // Appended to the "cannot open" message, e.g. how to install the missing file.
  std::string open_hint;
  // The sizes every item must have (the file's dimensions after the first), checked right after the header,
  // before any payload is read: {28, 28} for Fashion-MNIST images. Empty: any sizes.
  std::vector<int64_t> item_dims = {};
  // What the items are called when their sizes differ ("images are 28x29; expected 28x28").
  std::string item_name = "items";
};

struct IdxArray {
  std::vector<int64_t> dims;   // dims[0] is the number of items read (<= file_items with max_items)
  int64_t file_items = 0;      // dims[0] as stored in the file
  std::vector<uint8_t> data;   // prod(dims) bytes, row-major
};

// Reads the IDX file at `path`, which must carry `expected_magic` (kIdxImagesMagic, kIdxLabelsMagic, or any
// 0x000008DD). Throws dpe::Error naming the path and the problem.
IdxArray read_idx(const std::string& path, uint32_t expected_magic, const IdxReadOptions& options = {});

}  // namespace dpe::data
