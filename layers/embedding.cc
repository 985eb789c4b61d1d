#include "layers/embedding.h"

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/index.h"
#include "layers/init.h"

namespace dpe::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx)
    : Cloneable("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  DPE_CHECK(num_embeddings_ > 0 && embedding_dim_ > 0, "Embedding(", num_embeddings_, ", ", embedding_dim_,
            "): sizes must be positive");
  if (padding_idx.has_value()) {
    DPE_CHECK(*padding_idx >= -num_embeddings_ && *padding_idx < num_embeddings_, "Embedding: padding_idx ",
              *padding_idx, " must be within num_embeddings ", num_embeddings_);
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings_ : *padding_idx;
  }
  reset();
}

void Embedding::reset() {
  weight = register_parameter("weight", Tensor::empty({num_embeddings_, embedding_dim_}));
  init::normal_(weight, 0.0, 1.0);
  if (padding_idx_.has_value()) {
    NoGradGuard no_grad;
    weight.narrow(0, *padding_idx_, 1).zero_();
  }
}

// indices: int64 (*)  ->  (*, embedding_dim)
Tensor Embedding::forward(const Tensor& indices) {
  DPE_CHECK(indices.defined() && indices.dtype() == DType::Int64, "Embedding: expected int64 indices, got ",
            indices.defined() ? std::string(dtype_name(indices.dtype())) : std::string("an undefined tensor"));
  return embedding(weight, indices, padding_idx_);
}

}  // namespace dpe::nn
