// Reads golden fixtures written by tests/golden/golden_io.py (format documented there).
//
//   Golden g = load_golden("linear");           // tests/golden/data/linear.golden
//   Tensor x = g.tensor("x");                    // float32/float64/int64 on cpu:0
//
// The test target needs data = ["//tests/golden:data"] (the layers/, optim/ and engine/ test globs have it).
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace dpe::testing {

class Golden {
 public:
  explicit Golden(std::string name, std::map<std::string, Tensor> tensors)
      : name_(std::move(name)), tensors_(std::move(tensors)) {}
  // Throws naming the fixture and the key when absent.
  const Tensor& tensor(const std::string& key) const;
  bool contains(const std::string& key) const { return tensors_.count(key) > 0; }

 private:
  std::string name_;
  std::map<std::string, Tensor> tensors_;
};

// Loads tests/golden/data/<name>.golden (relative to the test's runfiles directory). Throws naming the file
// on a missing file or a malformed header.
Golden load_golden(const std::string& name);

// Max over elements of |a - b| / (|b| + atol_floor): the relative error the golden tests bound.
double max_relative_error(const Tensor& actual, const Tensor& expected, double atol_floor = 1e-6);

}  // namespace dpe::testing
