// Products with Q8_0 / Q4_0 weights against the float product of the dequantized weights, within the
// bound that quantizing the activations allows; every kernel this CPU has against the scalar one; the
// same result with one thread and with two.
#include "test_prelude.h"

#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/quant.h"
#include "random_blocks.h"

using Catch::Matchers::Contains;
using torchpatch::nn::QuantFormat;
using torchpatch::nn::QuantKernel;
using torchpatch::nn::QuantLayout;

namespace {

// Restores the process-wide kernel choice.
struct KernelChoice {
  QuantKernel previous;
  explicit KernelChoice(QuantKernel kernel) : previous(torchpatch::nn::set_quant_kernel(kernel)) {}
  ~KernelChoice() { torchpatch::nn::set_quant_kernel(previous); }
};

at::Tensor product(QuantKernel kernel, QuantFormat format, const at::Tensor& x, const at::Tensor& blocks,
                   int64_t out, const at::Tensor& bias, QuantLayout layout = QuantLayout::kBlocks) {
  KernelChoice choice(kernel);
  return torchpatch::nn::quant_linear(format, x, blocks, out, bias, layout);
}

// How far the product may be from x @ dequantize(W)^T: each activation moves by at most half its
// block's step (amax / 127 / 2), so output o moves by at most sum_j |w_oj| * step_j / 2; plus float rounding.
at::Tensor allowed_error(const at::Tensor& x, const at::Tensor& w) {
  const int64_t in = x.size(-1);
  const auto step = x.reshape({-1, in / 32, 32}).abs().amax(-1, true).div(127).expand({-1, in / 32, 32}).reshape(x.sizes());
  return at::matmul(step.to(at::kDouble) * 0.5, w.abs().to(at::kDouble).t()) +
         1e-5 * at::matmul(x.abs().to(at::kDouble), w.abs().to(at::kDouble).t()) + 1e-6;
}

// Whether `kernel` runs a vector kernel on this CPU.
bool resolves_to_vector(QuantKernel kernel) {
  KernelChoice choice(kernel);
  return torchpatch::nn::active_quant_kernel() != QuantKernel::kScalar;
}

}  // namespace

TEST_CASE("quantized products equal the float product of the dequantized weights, within the activations' step",
          "[quant][kernels]") {
  at::manual_seed(11);
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    // Row and token counts around the AVX-512 kernel's 4 x 4 tiles; 32 and 96 give an odd block count.
    // 32 and 257 rows make whole groups of 16 (kRows16) without and with a bias; 544 inputs are 17
    // blocks, an odd last block in a second group of 16 blocks (prefill).
    for (const int64_t rows : {1, 3, 6, 17, 32, 257}) {
      for (const int64_t in : {32, 96, 544, 768}) {
        for (const int64_t tokens : {1, 2, 3, 5, 17}) {
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
          const auto packed = torchpatch::nn::pack_blocks(format, blocks, "w");
          // Same int8 sums; only the float accumulation order differs.
          const auto tolerance = 1e-5 * at::matmul(x.abs(), dense.abs().t()) + 1e-6;
          for (const auto kernel : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512, QuantKernel::kAuto}) {
            if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
            const auto vector = product(kernel, format, x, blocks, rows, bias);
            const auto from_rows16 = product(kernel, format, x, packed, rows, bias, QuantLayout::kRows16);
            INFO("kernel " << static_cast<int>(kernel));
            CHECK(((vector - scalar).abs() - tolerance).max().item<double>() <= 0);
            CHECK(((from_rows16 - scalar).abs() - tolerance).max().item<double>() <= 0);
            // The vector kernels read kRows16's groups themselves; the scalar one reads GGUF rows.
            const bool own_order = resolves_to_vector(kernel) && rows >= 16;
            if (!own_order) CHECK(at::equal(from_rows16, vector));
          }
        }
      }
    }
  }
}

TEST_CASE("a token's outputs from kRows16 weights do not depend on how many tokens share the product",
          "[quant][kernels]") {
  // AVX-512 runs a group's 16 rows over 1, 2, 3 tokens (decoding) or 8 at a time (prefill), AVX2 over
  // 1-4 tokens, with the same arithmetic per token: a prompt's token gets from the product what it
  // gets from it alone.
  at::manual_seed(14);
  int kernels = 0;
  for (const auto kernel : {QuantKernel::kAvx512, QuantKernel::kAvx2}) {
  if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
  ++kernels;
  KernelChoice choice(kernel);
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0, QuantFormat::kQ4_1, QuantFormat::kQ5_0,
                            QuantFormat::kQ5_1}) {
    const int64_t rows = 48, in = 544;
    // The formats only read from GGUF files take the float path for 4 tokens and more; 1-3 tokens
    // share the kRows16 kernel.
    const bool written = torchpatch::nn::quantizes_to(format);
    const auto blocks = written ? torchpatch::nn::quantize(format, at::randn({rows, in}), "w") : testutil::random_blocks(format, rows, in);
    const auto packed = torchpatch::nn::pack_blocks(format, blocks, "w");
    const auto bias = at::randn({rows});
    const auto x = at::randn({written ? 21 : 3, in});
    const auto together = torchpatch::nn::quant_linear(format, x, packed, rows, bias, QuantLayout::kRows16);
    for (int64_t t = 0; t < x.size(0); ++t) {
      const auto alone = torchpatch::nn::quant_linear(format, x.narrow(0, t, 1), packed, rows, bias, QuantLayout::kRows16);
      INFO(torchpatch::nn::quant_kernel_name(kernel) << " " << torchpatch::nn::format_name(format) << " token " << t
                                                     << " max difference "
                                                     << (alone[0] - together[t]).abs().max().item<float>());
      CHECK(at::equal(alone[0], together[t]));
    }
  }
  }
  if (kernels == 0) WARN("no AVX2 or AVX-512 VNNI on this CPU: nothing to compare");
}

TEST_CASE("with AVX2 a token's outputs do not depend on how many tokens share the product", "[quant][kernels]") {
  // One token takes the dot kernel, more the tiles of 4 rows x 2 tokens, with the same operations.
  if (!torchpatch::nn::quant_kernel_available(QuantKernel::kAvx2)) {
    WARN("no AVX2 on this CPU: nothing to compare");
    return;
  }
  at::manual_seed(15);
  KernelChoice choice(QuantKernel::kAvx2);
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const int64_t rows = 23, in = 160;  // a short last tile of rows; 3 and 1 tokens after the pairs
    const auto blocks = torchpatch::nn::quantize(format, at::randn({rows, in}), "w");
    const auto bias = at::randn({rows});
    for (const int64_t tokens : {2, 3, 7}) {
      const auto x = at::randn({tokens, in});
      const auto together = torchpatch::nn::quant_linear(format, x, blocks, rows, bias);
      for (int64_t t = 0; t < tokens; ++t) {
        const auto alone = torchpatch::nn::quant_linear(format, x.narrow(0, t, 1), blocks, rows, bias);
        INFO(torchpatch::nn::format_name(format) << " tokens " << tokens << " token " << t << " max difference "
                                                 << (alone[0] - together[t]).abs().max().item<float>());
        CHECK(at::equal(alone[0], together[t]));
      }
    }
  }
}

TEST_CASE("a quantized product is the same with one thread and with two", "[quant][kernels]") {
  at::manual_seed(12);
  // A single token's product gets a part per 64 KB of weights: 1040 x 1024 splits at two threads.
  const auto small = at::randn({301, 256}), large = at::randn({1040, 1024});
  const int previous = at::get_num_threads();
  for (const auto kernel : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
    if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
    KernelChoice choice(kernel);
    for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
      for (const auto& w : {small, large}) {
        const auto blocks = torchpatch::nn::quantize(format, w, "w");
        const auto packed = torchpatch::nn::pack_blocks(format, blocks, "w");
        const int64_t rows = w.size(0), in = w.size(1);
        for (const int64_t tokens : {1, 3, 9}) {  // decoding, and tiles of tokens
          const auto x = at::randn({tokens, in});
          for (const auto layout : {QuantLayout::kBlocks, QuantLayout::kRows16}) {
            const auto& weights = layout == QuantLayout::kBlocks ? blocks : packed;
            at::set_num_threads(1);
            const auto one = torchpatch::nn::quant_linear(format, x, weights, rows, {}, layout);
            at::set_num_threads(2);
            const auto two = torchpatch::nn::quant_linear(format, x, weights, rows, {}, layout);
            INFO(torchpatch::nn::format_name(format) << " kernel " << static_cast<int>(kernel) << " tokens " << tokens
                                                     << " layout " << static_cast<int>(layout));
            CHECK(at::equal(one, two));
          }
        }
      }
    }
  }
  at::set_num_threads(previous);
}

TEST_CASE("single-token quantized products made on two threads at once equal those made one at a time",
          "[quant][kernels][threads]") {
  // Both callers want the decode team's worker threads (base/parallel.h); whichever does not get them
  // works alone. Under TSan this is the test of the team's synchronisation.
  at::manual_seed(13);
  const int previous = at::get_num_threads();
  at::set_num_threads(2);
  const auto format = QuantFormat::kQ4_0;
  const auto layout = torchpatch::nn::preferred_quant_layout();
  auto weights = torchpatch::nn::quantize(format, at::randn({1040, 1024}), "w");
  if (layout == QuantLayout::kRows16) weights = torchpatch::nn::pack_blocks(format, weights, "w");
  std::vector<at::Tensor> inputs, expected;
  for (int i = 0; i < 2; ++i) {
    inputs.push_back(at::randn({1, 1024}));
    expected.push_back(torchpatch::nn::quant_linear(format, inputs.back(), weights, 1040, {}, layout));
  }
  std::vector<int> mismatches(inputs.size(), 0);
  const auto caller = [&](std::size_t i) {
    for (int round = 0; round < 200; ++round) {
      const auto y = torchpatch::nn::quant_linear(format, inputs[i], weights, 1040, {}, layout);
      if (!at::equal(y, expected[i])) ++mismatches[i];
    }
  };
  std::thread first(caller, 0), second(caller, 1);
  first.join();
  second.join();
  at::set_num_threads(previous);
  CHECK(mismatches == std::vector<int>{0, 0});
}

TEST_CASE("a quantized product of no tokens is empty, with every kernel", "[quant][kernels]") {
  const auto blocks = torchpatch::nn::quantize(QuantFormat::kQ4_0, at::randn({6, 64}), "w");
  for (const auto kernel : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
    const auto y = product(kernel, QuantFormat::kQ4_0, at::randn({0, 64}), blocks, 6, {});
    CHECK(y.sizes() == at::IntArrayRef({0, 6}));
  }
}

TEST_CASE("the vector kernels quantize activations as the scalar one, NaN and infinity included", "[quant][kernels]") {
  // Ties (x * 127 / amax exactly half-way) and non-finite inputs take the same path in both kernels.
  // Row 0: amax 127, so x * 127 / amax is x itself, and every other value is half-way (k + 0.5).
  auto x = at::arange(-64, 64, at::kFloat).reshape({2, 64}) + 0.5;
  x[0][0] = 127;
  x[0][32] = -127;
  x[1][3] = std::numeric_limits<float>::quiet_NaN();
  x[1][40] = std::numeric_limits<float>::infinity();
  at::manual_seed(13);
  const auto w = at::randn({5, 64});
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const auto blocks = torchpatch::nn::quantize(format, w, "w");
    const auto dense = torchpatch::nn::dequantize(format, blocks, "w");
    const auto scalar = product(QuantKernel::kScalar, format, x, blocks, 5, {});
    for (const auto kernel : {QuantKernel::kAvx512, QuantKernel::kAvx2}) {
      if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
      INFO(torchpatch::nn::quant_kernel_name(kernel) << " " << torchpatch::nn::format_name(format));
      const auto vector = product(kernel, format, x, blocks, 5, {});
      // Float rounding only (an activation rounded the other way would move an output by ~d_x * |w|).
      const auto tolerance = 1e-5 * at::matmul(x[0].abs(), dense.abs().t()) + 1e-6;
      CHECK(((vector[0] - scalar[0]).abs() - tolerance).max().item<double>() <= 0);
      CHECK(at::equal(at::isnan(scalar[1]), at::isnan(vector[1])));
    }
  }
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


TEST_CASE("products with GGUF's other block formats equal the float product of their dequantized weights, "
          "within rounding or the activations' step",
          "[quant][kernels][gguf]") {
  at::manual_seed(21);
  const QuantFormat formats[] = {QuantFormat::kQ4_1, QuantFormat::kQ5_0, QuantFormat::kQ5_1, QuantFormat::kQ2_K,
                                 QuantFormat::kQ3_K, QuantFormat::kQ4_K, QuantFormat::kQ5_K, QuantFormat::kQ6_K};
  for (const auto format : formats) {
    const int64_t weights = torchpatch::nn::block_weights(format);
    // One block, an odd count, several; 1-3 tokens of the 32-weight formats quantize the activations
    // (pairs of blocks, 16 rows summed at once), more go row by row, 16 and more by tiles of 64 rows.
    for (const int64_t in : {weights, 3 * weights, 8 * weights}) {
      for (const int64_t rows : {1, 17, 70}) {
        for (const int64_t tokens : {1, 2, 3, 5, 17}) {
          const auto blocks = testutil::random_blocks(format, rows, in);
          const auto dense = torchpatch::nn::dequantize(format, blocks, "w");
          const auto x = at::randn({tokens, in});
          const auto bias = rows % 2 ? at::randn({rows}) : at::Tensor();
          const auto expected = at::matmul(x.to(at::kDouble), dense.to(at::kDouble).t()) +
                                (bias.defined() ? bias.to(at::kDouble) : at::zeros({rows}, at::kDouble));
          // Float activations: only float rounding (sums in another order, a fused a q + b).
          const auto rounding = 1e-5 * at::matmul(x.abs().to(at::kDouble), dense.abs().to(at::kDouble).t()) + 1e-6;
          const bool quantized_activations = weights == 32 && tokens < 4;
          const auto bound = quantized_activations ? allowed_error(x, dense) : rounding;
          INFO(torchpatch::nn::format_name(format) << " rows " << rows << " in " << in << " tokens " << tokens);
          const auto scalar = product(QuantKernel::kScalar, format, x, blocks, rows, bias);
          for (const auto kernel : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
            if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
            const auto y = product(kernel, format, x, blocks, rows, bias);
            INFO("kernel " << static_cast<int>(kernel) << " max difference "
                           << (y.to(at::kDouble) - expected).abs().max().item<double>());
            CHECK(((y.to(at::kDouble) - expected).abs() - bound).max().item<double>() <= 0);
            // The same int8 sums whatever the kernel; only the float accumulation order differs.
            CHECK(((y - scalar).abs().to(at::kDouble) - rounding).max().item<double>() <= 0);
            if (weights == 32) {  // also laid out as kRows16: 17 and 70 rows are groups and a tail
              const auto packed = torchpatch::nn::pack_blocks(format, blocks, "w");
              const auto y16 = product(kernel, format, x, packed, rows, bias, QuantLayout::kRows16);
              INFO("kRows16 max difference " << (y16.to(at::kDouble) - expected).abs().max().item<double>());
              CHECK(((y16.to(at::kDouble) - expected).abs() - bound).max().item<double>() <= 0);
              CHECK(((y16 - scalar).abs().to(at::kDouble) - rounding).max().item<double>() <= 0);
            }
          }
        }
      }
    }
  }
  // They are read, not written; and a product on a GPU is refused before anything runs.
  CHECK_THROWS_WITH(torchpatch::nn::quantize(QuantFormat::kQ4_K, at::randn({2, 256}), "w"),
                    Contains("q4_k blocks are read from GGUF files, not written"));
  CHECK_THROWS_WITH(torchpatch::nn::quant_linear(QuantFormat::kQ6_K, at::randn({1, 200}), testutil::random_blocks(QuantFormat::kQ6_K, 2, 256), 2),
                    Contains("a multiple of 256"));
}

TEST_CASE("a Linear whose weight was dequantized from blocks decodes from them, and stops when the weight changes",
          "[quant][kernels][gguf]") {
  at::manual_seed(22);
  at::NoGradGuard no_grad;
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0, QuantFormat::kQ4_1, QuantFormat::kQ6_K}) {
    const int64_t in = 3 * torchpatch::nn::block_weights(format), rows = 37;
    const auto blocks = testutil::random_blocks(format, rows, in);
    torchpatch::nn::Linear linear(in, rows, /*bias=*/true);
    linear.weight.copy_(torchpatch::nn::dequantize(format, blocks, "w"));
    REQUIRE(linear.decode_from_blocks(format, blocks));
    CHECK(linear.decode_blocks().data_ptr() == blocks.data_ptr());
    const auto expected_for = [&](const at::Tensor& x) {
      return at::matmul(x.to(at::kDouble), linear.weight.to(at::kDouble).t()) + linear.bias.to(at::kDouble);
    };
    for (const int64_t tokens : {1, 2, 15, 16}) {  // 16 rows and more read the float weight
      const auto x = at::randn({tokens, in});
      const auto bound = 1e-5 * at::matmul(x.abs().to(at::kDouble), linear.weight.abs().to(at::kDouble).t()) + 1e-6;
      for (const auto kernel : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
        if (!torchpatch::nn::quant_kernel_available(kernel)) continue;
        KernelChoice choice(kernel);
        const auto y = linear.forward(x).to(at::kDouble);
        INFO(torchpatch::nn::format_name(format) << " tokens " << tokens << " kernel " << static_cast<int>(kernel)
                                                 << " max difference " << (y - expected_for(x)).abs().max().item<double>());
        CHECK(((y - expected_for(x)).abs() - bound).max().item<double>() <= 0);
      }
    }
    // Changed in place: the blocks no longer hold the weight, and products read the weight again.
    linear.weight.mul_(2);
    CHECK_FALSE(linear.decode_blocks().defined());
    const auto x = at::randn({1, in});
    const auto bound = 1e-5 * at::matmul(x.abs().to(at::kDouble), linear.weight.abs().to(at::kDouble).t()) + 1e-6;
    CHECK(((linear.forward(x).to(at::kDouble) - expected_for(x)).abs() - bound).max().item<double>() <= 0);
    // Blocks that do not hold the weight are declined.
    CHECK_FALSE(linear.decode_from_blocks(format, blocks));
    CHECK_FALSE(linear.decode_from_blocks(format, blocks.narrow(0, 0, rows - 1)));
  }
}
