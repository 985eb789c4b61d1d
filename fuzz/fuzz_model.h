// The small model the checkpoint harness loads into and the corpus generator saves: a Linear(3, 2) in
// float32 and an int64 buffer, so that a checkpoint holds two dtypes, a matrix, a vector and a scalar-ish
// buffer. The optimizer is Adam (state tensors and a scalar per parameter).
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace dpe::fuzz {

class TinyModel : public nn::Cloneable<TinyModel> {
 public:
  TinyModel() : Cloneable("TinyModel") { reset(); }
  void reset() override {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    steps = register_buffer("steps", Tensor::from_vector(std::vector<int64_t>{5}, {1}));
  }
  // x: (N, 3) -> (N, 2)
  Tensor forward(const Tensor& x) override { return fc->forward(x); }

  std::shared_ptr<nn::Linear> fc;
  Tensor steps;
};

}  // namespace dpe::fuzz
