// Q8_0 / Q4_0 on CUDA: checks the operands, then runs nn/cuda/quant_kernels.cu on the current stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "nn/cuda/quant_kernels.h"
#include "nn/quant_device.h"
#include "torchpatch/error.h"

namespace torchpatch::nn {
namespace {

cuda::Element element_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::Element::kFloat;
    case at::kBFloat16: return cuda::Element::kBFloat16;
    case at::kHalf: return cuda::Element::kHalf;
    default:
      throw InputError(fmt::format("quantized product on CUDA: {} must be float32, bfloat16 or float16, not {}", what,
                                   c10::toString(t.scalar_type())));
  }
}

void check_blocks(QuantFormat format, const at::Tensor& blocks, int64_t rows, int64_t in, const std::string& name) {
  const int64_t row_bytes = in / kQuantBlockSize * block_bytes(format);
  if (blocks.scalar_type() != at::kByte || blocks.dim() != 2 || blocks.size(0) != rows || blocks.size(1) != row_bytes ||
      !blocks.is_contiguous() || !blocks.is_cuda()) {
    throw InputError(fmt::format("{}: {} blocks on CUDA must be contiguous uint8 [{}, {}] on the device, not {} {} on {}",
                                 name, format_name(format), rows, row_bytes, c10::toString(blocks.scalar_type()),
                                 fmt::join(blocks.sizes(), "x"), blocks.device().str()));
  }
}

at::Tensor linear_on_cuda(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                             const at::Tensor& bias) {
  const int64_t in = x.dim() == 0 ? 0 : x.size(-1);
  if (in == 0 || in % kQuantBlockSize != 0) {
    throw InputError(fmt::format("{} linear: input must be [..., a multiple of 32], not {}", format_name(format),
                                 fmt::join(x.sizes(), "x")));
  }
  check_blocks(format, blocks, out_features, in, std::string(format_name(format)) + " linear weight");
  if (x.device() != blocks.device()) {
    throw InputError(fmt::format("{} linear: input on {}, weight blocks on {}", format_name(format), x.device().str(),
                                 blocks.device().str()));
  }
  const auto element = element_of(x, "the input");
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != out_features || bias.device() != x.device())) {
    throw InputError(fmt::format("{} linear: bias must be [{}] on {}, not {} on {}", format_name(format), out_features,
                                 x.device().str(), fmt::join(bias.sizes(), "x"), bias.device().str()));
  }
  const at::Tensor b = bias.defined() ? bias.to(x.scalar_type()).contiguous() : at::Tensor();
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor input = x.contiguous();
  const int64_t tokens = x.numel() / in;
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = out_features;
  if (tokens == 0 || out_features == 0) return at::zeros(out_sizes, x.options());  // nothing to launch
  if (tokens > cuda::kMaxGemvTokens) {
    // Prefill: the weights in x's dtype once, then cuBLAS.
    at::Tensor weight = at::empty({out_features, in}, x.options());
    cuda::launch_dequantize(format == QuantFormat::kQ4_0, blocks.data_ptr<uint8_t>(), weight.data_ptr(), out_features,
                            in, element, at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return at::linear(input, weight, b);
  }
  at::Tensor out = at::empty(out_sizes, x.options());
  cuda::launch_quant_gemv(format == QuantFormat::kQ4_0, blocks.data_ptr<uint8_t>(), input.data_ptr(), out.data_ptr(),
                          b.defined() ? b.data_ptr() : nullptr, out_features, in, static_cast<int>(tokens), element,
                          at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor dequantize_on_cuda(QuantFormat format, const at::Tensor& blocks, const std::string&) {
  const at::Tensor q = blocks.contiguous();
  const int64_t in = q.size(-1) / block_bytes(format) * kQuantBlockSize;
  const int64_t rows = q.numel() / q.size(-1);
  const c10::cuda::CUDAGuard guard(q.device());
  auto out_sizes = q.sizes().vec();
  out_sizes.back() = in;
  at::Tensor out = at::empty(out_sizes, q.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;  // nothing to launch
  cuda::launch_dequantize(format == QuantFormat::kQ4_0, q.data_ptr<uint8_t>(), out.data_ptr(), rows, in,
                          cuda::Element::kFloat, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

const bool registered = (register_quant_cuda_kernels({&linear_on_cuda, &dequantize_on_cuda}), true);

}  // namespace
}  // namespace torchpatch::nn
