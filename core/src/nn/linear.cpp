#include "torchpatch/nn/linear.h"

#include <atomic>

#include <ATen/ATen.h>

#include "nn/gemm.h"
#include "nn/gemv.h"
#include "nn/quant_ggml.h"
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

Linear::Linear(const at::Tensor& shared_weight) { weight = register_parameter("weight", shared_weight); }

namespace {
std::atomic<DecodeKernel> chosen_decode_kernel{DecodeKernel::kAuto};
std::atomic<MatmulKernel> matmul_kernel{kHaveOneDnnGemm ? MatmulKernel::kOneDnn : MatmulKernel::kBlas};

// y = x W^T (x [rows, k]) for float32 and float64 without gradients; undefined where at::linear is the
// one to use (several rows of float64, or on LibTorch's BLAS by choice).
at::Tensor product(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t rows = x.size(0), n = weight.size(0), k = weight.size(1);
  const bool float32 = x.scalar_type() == at::kFloat;
  if (rows == 1) {
    const auto kernel = decode_kernel();
    if (kernel == DecodeKernel::kBlas || !float32) return at::mv(weight, x.reshape({-1})).view({1, n});
    auto y = at::empty({1, n}, x.options());
    fast_gemv(kernel, weight.data_ptr<float>(), x.data_ptr<float>(), y.data_ptr<float>(), n, k);
    return y;
  }
  if (!float32 || matmul_kernel.load(std::memory_order_relaxed) == MatmulKernel::kBlas) return {};
  auto y = at::empty({rows, n}, x.options());
#if defined(TORCHPATCH_ONEDNN_GEMM)
  onednn_gemm(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), rows, n, k);
#endif
  return y;
}
}  // namespace

DecodeKernel set_decode_kernel(DecodeKernel kernel) { return chosen_decode_kernel.exchange(kernel); }
DecodeKernel decode_kernel() { return resolve_decode_kernel(chosen_decode_kernel.load(std::memory_order_relaxed)); }
MatmulKernel set_matmul_kernel(MatmulKernel kernel) {
  return matmul_kernel.exchange(kHaveOneDnnGemm ? kernel : MatmulKernel::kBlas);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const auto type = x.scalar_type();
  const bool own_kernels =
      (type == at::kFloat || type == at::kDouble) && weight.scalar_type() == type && x.is_cpu() && weight.is_cpu() &&
      weight.dim() == 2 && weight.is_contiguous() && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
      x.numel() > 0 && weight.numel() > 0 &&
      (!bias.defined() || (bias.scalar_type() == type && bias.is_cpu() && bias.dim() == 1 && bias.size(0) == weight.size(0)));
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  at::Tensor y;
  if (own_kernels && !needs_grad) y = product(x.reshape({-1, weight.size(1)}).contiguous(), weight);
  if (!y.defined()) return at::linear(x, weight, bias);
  if (bias.defined()) y.add_(bias);
  auto out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  return y.view(out_shape);
}

bool Linear::decode_from_blocks(QuantFormat format, const at::Tensor& blocks) {
  decode_blocks_.reset();
  if (!weight.defined() || weight.dim() != 2 || !weight.is_cpu() || weight.scalar_type() != at::kFloat ||
      !weight.is_contiguous() || weight.is_inference() || !blocks.defined() || !blocks.is_cpu() ||
      blocks.scalar_type() != at::kByte || !blocks.is_contiguous() || blocks.dim() != 2 ||
      blocks.size(0) != weight.size(0) || weight.size(1) % block_weights(format) != 0 ||
      blocks.size(1) != weight.size(1) / block_weights(format) * block_bytes(format)) {
    return false;
  }
  auto values = at::empty_like(weight);
  dequantize_ggml(ggml_type(format), blocks.data_ptr<uint8_t>(), values.numel(), values.data_ptr<float>());
  if (!at::equal(values, weight)) return false;
  decode_blocks_ = DecodeBlocks{format, blocks, weight.data_ptr(), weight._version()};
  return true;
}

at::Tensor Linear::decode_blocks() const {
  const bool current = decode_blocks_ && weight.data_ptr() == decode_blocks_->weight_data &&
                       weight._version() == decode_blocks_->weight_version;
  return current ? decode_blocks_->blocks : at::Tensor();
}

at::Tensor Linear::forward(const at::Tensor& x) {
  const int64_t in = weight.size(1);
  const int64_t rows = x.dim() >= 1 && x.size(-1) == in ? x.numel() / in : 0;
  const bool needs_grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (rows < 1 || rows > 15 || x.scalar_type() != at::kFloat || !x.is_cpu() || needs_grad || !decode_blocks().defined()) {
    return linear(x, weight, bias);
  }
  const auto input = x.contiguous();
  auto out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  auto y = at::empty(out_shape, x.options());
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  ggml::linear(decode_blocks_->format, ggml::resolved_quant_kernel(), input.data_ptr<float>(), rows, in,
               decode_blocks_->blocks.data_ptr<uint8_t>(), weight.size(0), b.defined() ? b.data_ptr<float>() : nullptr,
               y.data_ptr<float>());
  return y;
}

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
