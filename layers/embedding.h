// Embedding: PyTorch's nn.Embedding. weight (num_embeddings, embedding_dim) ~ N(0, 1) from the default
// generator of the parameter's device; the padding_idx row (if any) is zeroed at initialisation and never
// receives a gradient (core/ops/index.h embedding).
#pragma once

#include <optional>

#include "layers/module.h"

namespace dpe::nn {

class Embedding : public Cloneable<Embedding> {
 public:
  // padding_idx may be negative (counts from num_embeddings), like PyTorch; stored normalised.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = {});

  void reset() override;
  // indices: int64 of any shape, values in [0, num_embeddings)  ->  (*indices.shape, embedding_dim)
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  std::optional<int64_t> padding_idx() const { return padding_idx_; }
  Tensor weight;  // (num_embeddings, embedding_dim)

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
  std::optional<int64_t> padding_idx_;
};

}  // namespace dpe::nn
