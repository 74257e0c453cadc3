#include "torchpatch/nn/linear.h"

#include <atomic>

#include <ATen/ATen.h>

#include "nn/gemv.h"
#include "torchpatch/patching/build.h"

namespace torchpatch::nn {

namespace {
thread_local int skip_init_depth = 0;
}  // namespace

at::Tensor new_parameter(at::IntArrayRef sizes, bool is_bias, double std) {
  at::Tensor t = at::empty(sizes);
  if (!SkipInit::active()) init_parameter(t, is_bias, /*is_norm=*/false, std);
  return t;
}

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

namespace {
std::atomic<DecodeKernel> decode_kernel{DecodeKernel::kAuto};
}  // namespace

DecodeKernel set_decode_kernel(DecodeKernel kernel) { return decode_kernel.exchange(kernel); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool one_row = x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1) && x.numel() == weight.size(1);
  const bool same_type = x.scalar_type() == weight.scalar_type() &&
                         (!bias.defined() || bias.scalar_type() == x.scalar_type());
  const bool blas_type = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  if (!one_row || !same_type || !blas_type || !x.is_cpu() || !weight.is_cpu() || x.numel() == 0) {
    return at::linear(x, weight, bias);
  }
  auto out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  const auto kernel = resolve_decode_kernel(decode_kernel.load(std::memory_order_relaxed));
  const bool needs_grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  at::Tensor y;
  if (kernel != DecodeKernel::kBlas && !needs_grad && x.scalar_type() == at::kFloat && weight.is_contiguous()) {
    const auto vec = x.reshape({-1}).contiguous();
    y = at::empty({weight.size(0)}, x.options());
    fast_gemv(kernel, weight.data_ptr<float>(), vec.data_ptr<float>(), y.data_ptr<float>(), weight.size(0),
              weight.size(1));
  } else {
    y = at::mv(weight, x.reshape({-1}));
  }
  if (bias.defined()) y = y + bias;
  return y.view(out_shape);
}

at::Tensor Linear::forward(const at::Tensor& x) { return linear(x, weight, bias); }

std::shared_ptr<roles::Linear> make_linear(const std::string& name, int64_t in_features, int64_t out_features,
                                           bool bias) {
  return build_child<roles::Linear>(
      "Linear", name, {{"in_features", in_features}, {"out_features", out_features}, {"bias", bias}});
}


Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim) {
  weight = register_parameter("weight", new_parameter({num_embeddings, embedding_dim}, false));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

}  // namespace torchpatch::nn
