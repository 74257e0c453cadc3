// Products with Q8_0 / Q4_0 weights against the float product of the dequantized weights, within the
// bound that quantizing the activations allows; every kernel this CPU has against the scalar one; the
// same result with one thread and with two.
#include "test_prelude.h"

#include <cstdio>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "torchpatch/error.h"
#include "torchpatch/nn/quant.h"

using Catch::Matchers::Contains;
using torchpatch::nn::QuantFormat;
using torchpatch::nn::QuantKernel;

namespace {

// Restores the process-wide kernel choice.
struct KernelChoice {
  QuantKernel previous;
  explicit KernelChoice(QuantKernel kernel) : previous(torchpatch::nn::set_quant_kernel(kernel)) {}
  ~KernelChoice() { torchpatch::nn::set_quant_kernel(previous); }
};

at::Tensor product(QuantKernel kernel, QuantFormat format, const at::Tensor& x, const at::Tensor& blocks,
                   int64_t out, const at::Tensor& bias) {
  KernelChoice choice(kernel);
  return torchpatch::nn::quant_linear(format, x, blocks, out, bias);
}

// How far the product may be from x @ dequantize(W)^T: each activation moves by at most half its
// block's step (amax / 127 / 2), so output o moves by at most sum_j |w_oj| * step_j / 2; plus float rounding.
at::Tensor allowed_error(const at::Tensor& x, const at::Tensor& w) {
  const int64_t in = x.size(-1);
  const auto step = x.reshape({-1, in / 32, 32}).abs().amax(-1, true).div(127).expand({-1, in / 32, 32}).reshape(x.sizes());
  return at::matmul(step.to(at::kDouble) * 0.5, w.abs().to(at::kDouble).t()) +
         1e-5 * at::matmul(x.abs().to(at::kDouble), w.abs().to(at::kDouble).t()) + 1e-6;
}

}  // namespace

TEST_CASE("quantized products equal the float product of the dequantized weights, within the activations' step",
          "[quant][kernels]") {
  at::manual_seed(11);
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    for (const int64_t rows : {1, 3, 17, 257}) {
      for (const int64_t in : {32, 64, 768}) {
        for (const int64_t tokens : {1, 2, 5}) {
          const auto w = at::randn({rows, in}) * 0.05;
          const auto blocks = torchpatch::nn::quantize(format, w, "w");
          const auto dense = torchpatch::nn::dequantize(format, blocks, "w");
          const auto x = at::randn({tokens, in});
          const auto bias = rows % 2 ? at::randn({rows}) : at::Tensor();
          const auto expected = at::matmul(x.to(at::kDouble), dense.to(at::kDouble).t()) +
                                (bias.defined() ? bias.to(at::kDouble) : at::zeros({rows}, at::kDouble));
          const auto bound = allowed_error(x, dense);
          const auto scalar = product(QuantKernel::kScalar, format, x, blocks, rows, bias);
          INFO(torchpatch::nn::format_name(format) << " rows " << rows << " in " << in << " tokens " << tokens);
          CHECK(((scalar.to(at::kDouble) - expected).abs() - bound).max().item<double>() <= 0);
          if (!torchpatch::nn::quant_kernel_available(QuantKernel::kAvx2)) continue;
          const auto avx2 = product(QuantKernel::kAvx2, format, x, blocks, rows, bias);
          // Same int8 sums; only the float accumulation order differs.
          const auto tolerance = 1e-5 * at::matmul(x.abs(), dense.abs().t()) + 1e-6;
          CHECK(((avx2 - scalar).abs() - tolerance).max().item<double>() <= 0);
        }
      }
    }
  }
}

TEST_CASE("a quantized product is the same with one thread and with two", "[quant][kernels]") {
  at::manual_seed(12);
  const auto w = at::randn({300, 256});
  const auto x = at::randn({3, 256});
  const int previous = at::get_num_threads();
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const auto blocks = torchpatch::nn::quantize(format, w, "w");
    at::set_num_threads(1);
    const auto one = torchpatch::nn::quant_linear(format, x, blocks, 300);
    at::set_num_threads(2);
    const auto two = torchpatch::nn::quant_linear(format, x, blocks, 300);
    CHECK(at::equal(one, two));
  }
  at::set_num_threads(previous);
}

TEST_CASE("a quantized product reports operands that do not fit", "[quant][kernels]") {
  const auto blocks = torchpatch::nn::quantize(QuantFormat::kQ8_0, at::randn({4, 64}), "w");
  CHECK_THROWS_WITH(torchpatch::nn::quant_linear(QuantFormat::kQ8_0, at::randn({2, 96}), blocks, 4),
                    "q8_0 linear: weight blocks must be contiguous uint8 [4, 102] for input 96, not Byte 4x68");
  CHECK_THROWS_WITH(torchpatch::nn::quant_linear(QuantFormat::kQ8_0, at::randn({2, 64}, at::kDouble), blocks, 4),
                    "q8_0 linear: input must be float32 [..., a multiple of 32], not Double 2x64");
  CHECK_THROWS_WITH(torchpatch::nn::quant_linear(QuantFormat::kQ8_0, at::randn({2, 64}), blocks, 4, at::zeros({5})),
                    "q8_0 linear: bias must be float32 [4], not Float 5");
  // Q4_0 blocks read as Q8_0 are the wrong width.
  const auto q4 = torchpatch::nn::quantize(QuantFormat::kQ4_0, at::randn({4, 64}), "w");
  CHECK_THROWS_WITH(torchpatch::nn::quant_linear(QuantFormat::kQ8_0, at::randn({1, 64}), q4, 4),
                    Contains("must be contiguous uint8 [4, 68]"));
}
