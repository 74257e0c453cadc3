#include "torchpatch/nn/linear.h"

#include <ATen/ATen.h>

namespace torchpatch::nn {

namespace {
thread_local int skip_init_depth = 0;

at::Tensor new_parameter(at::IntArrayRef sizes, bool is_bias) {
  at::Tensor t = at::empty(sizes);
  if (!SkipInit::active()) init_parameter(t, is_bias, /*is_norm=*/false);
  return t;
}
}  // namespace

SkipInit::SkipInit() { ++skip_init_depth; }
SkipInit::~SkipInit() { --skip_init_depth; }
bool SkipInit::active() { return skip_init_depth > 0; }

void init_parameter(at::Tensor& param, bool is_bias, bool is_norm, double std) {
  at::NoGradGuard no_grad;
  if (is_norm) {
    param.fill_(1.0);
  } else if (is_bias) {
    param.zero_();
  } else {
    param.normal_(0.0, std);
  }
}

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias) {
  weight = register_parameter("weight", new_parameter({out_features, in_features}, false));
  if (with_bias) bias = register_parameter("bias", new_parameter({out_features}, true));
}

at::Tensor Linear::forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim) {
  weight = register_parameter("weight", new_parameter({num_embeddings, embedding_dim}, false));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

}  // namespace torchpatch::nn
