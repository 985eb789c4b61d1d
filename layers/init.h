// Parameter initialisation with PyTorch's defaults (torch.nn.init), drawn from the tensor's device's
// default generator (so manual_seed makes a model's initial weights reproducible).
#pragma once

#include "core/tensor.h"

namespace dpe::nn::init {

// fan_in of a weight: size(1) * receptive field (product of dims from 2 on), as PyTorch computes it.
int64_t fan_in(const Tensor& weight);

// PyTorch's default for Linear/Conv weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
// (kaiming_uniform_ with a = sqrt(5) reduces to this bound).
void uniform_fan_in_(Tensor& t, int64_t fan_in);
void uniform_(Tensor& t, double low, double high);
void normal_(Tensor& t, double mean, double std);
void zeros_(Tensor& t);
void ones_(Tensor& t);

}  // namespace dpe::nn::init
