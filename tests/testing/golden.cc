#include "tests/testing/golden.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace dpe::testing {

const Tensor& Golden::tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  DPE_CHECK(it != tensors_.end(), "golden fixture '", name_, "' has no tensor '", key, "'");
  return it->second;
}

Golden load_golden(const std::string& name) {
  std::string path = "tests/golden/data/" + name + ".golden";
  std::ifstream in(path, std::ios::binary);
  DPE_CHECK(in.good(), "cannot open golden fixture ", path,
            " (regenerate with /usr/bin/python3 tests/golden/gen_*.py; is the test's data dependency set?)");
  std::string line;
  std::getline(in, line);
  DPE_CHECK(line == "dpe-golden 1", path, ": not a dpe golden file (first line '", line, "')");
  struct Entry {
    std::string key;
    DType dtype;
    Shape shape;
  };
  std::vector<Entry> entries;
  while (std::getline(in, line) && line != "end") {
    std::istringstream fields(line);
    std::string key, dtype, dims;
    fields >> key >> dtype >> dims;
    DPE_CHECK(!key.empty() && !dims.empty(), path, ": malformed header line '", line, "'");
    Shape shape;
    if (dims != "-") {
      std::istringstream d(dims);
      for (std::string part; std::getline(d, part, ',');) shape.push_back(std::stoll(part));
    }
    entries.push_back({key, parse_dtype(dtype), shape});
  }
  DPE_CHECK(line == "end", path, ": header has no 'end' line");
  std::map<std::string, Tensor> tensors;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, TensorOptions(e.dtype));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    DPE_CHECK(in.gcount() == static_cast<std::streamsize>(t.nbytes()), path, ": truncated data for '", e.key, "'");
    tensors[e.key] = t;
  }
  return Golden(name, std::move(tensors));
}

double max_relative_error(const Tensor& actual, const Tensor& expected, double atol_floor) {
  DPE_CHECK(actual.shape() == expected.shape(), "max_relative_error: shapes ", shape_str(actual.shape()), " and ",
            shape_str(expected.shape()));
  std::vector<double> a = actual.to_vector<double>(), b = expected.to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::abs(a[i] - b[i]) / (std::abs(b[i]) + atol_floor);
    if (std::isnan(err)) return INFINITY;
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace dpe::testing
