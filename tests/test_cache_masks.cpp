// DynamicCache (full and sliding layers), attention masks, and the linear kernels (one row and several).
#include "test_prelude.h"
#include "test_util.h"

#include <numeric>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/generation/cache.h"
#include "torchpatch/models/config.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/masks.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {
// k/v [1, 2, n, 4] whose every entry is the token's absolute position: easy to read back.
at::Tensor tokens(int64_t first, int64_t n) {
  return at::arange(first, first + n, at::kFloat).view({1, 1, n, 1}).expand({1, 2, n, 4}).contiguous();
}
std::vector<int64_t> positions_of(const at::Tensor& kv) {
  const auto p = kv.select(1, 0).select(2, 0).select(0, 0).to(at::kLong).contiguous();
  return {p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel()};
}
}  // namespace

TEST_CASE("a full cache layer returns every token and grows without copying each step", "[cache]") {
  DynamicLayer layer;
  layer.reserve(16);
  auto [k0, v0] = layer.update(tokens(0, 5), tokens(0, 5));
  CHECK(positions_of(k0) == std::vector<int64_t>{0, 1, 2, 3, 4});
  const void* storage = k0.data_ptr();
  at::Tensor k;
  for (int64_t t = 5; t < 16; ++t) k = layer.update(tokens(t, 1), tokens(t, 1)).first;
  CHECK(k.data_ptr() == storage);  // reserved: written in place
  CHECK(positions_of(k).size() == 16);
  CHECK(positions_of(k).back() == 15);
  k = layer.update(tokens(16, 1), tokens(16, 1)).first;  // past the reservation: grows once, keeps all
  CHECK(positions_of(k) == [] { std::vector<int64_t> all(17); std::iota(all.begin(), all.end(), 0); return all; }());
  CHECK(layer.seq_length() == 17);
  CHECK(layer.mask_sizes(3).length == 20);
  CHECK(layer.mask_sizes(3).offset == 0);
  layer.crop(10);
  CHECK(layer.seq_length() == 10);
  CHECK(positions_of(layer.update(tokens(10, 1), tokens(10, 1)).first).back() == 10);
}

TEST_CASE("a sliding cache layer keeps window-1 tokens and returns them with the new ones", "[cache]") {
  SlidingWindowLayer layer(4);
  auto k = layer.update(tokens(0, 6), tokens(0, 6)).first;  // prefill longer than the window
  CHECK(positions_of(k) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});  // returns the whole concatenation
  CHECK(layer.seq_length() == 6);
  CHECK(layer.mask_sizes(1).offset == 3);
  CHECK(layer.mask_sizes(1).length == 4);
  for (int64_t t = 6; t < 40; ++t) {
    k = layer.update(tokens(t, 1), tokens(t, 1)).first;
    REQUIRE(positions_of(k) == std::vector<int64_t>{t - 3, t - 2, t - 1, t});
  }
  CHECK(layer.seq_length() == 40);
  REQUIRE_THROWS_WITH(layer.crop(30), Contains("cannot crop a sliding-window cache layer after it has seen 40 tokens"));
  SlidingWindowLayer young(4);
  young.update(tokens(0, 2), tokens(0, 2));
  CHECK(young.mask_sizes(1).length == 3);
  CHECK(young.mask_sizes(1).offset == 0);
}

TEST_CASE("DynamicCache follows the config's layer types and reorders its batch", "[cache]") {
  DecoderConfig config;
  config.num_hidden_layers = 3;
  config.sliding_window = 2;
  config.layer_types = {kFullAttention, kSlidingAttention, kFullAttention};
  DynamicCache cache(config);
  REQUIRE(cache.size() == 3);
  CHECK_FALSE(cache.layer(0).sliding_window());
  CHECK(cache.layer(1).sliding_window() == 2);
  auto batch = at::cat({tokens(0, 3), tokens(100, 3)}, 0);  // rows hold 0.. and 100..
  for (int64_t i = 0; i < 3; ++i) cache.update(batch, batch, i);
  CHECK(cache.get_seq_length() == 3);
  CHECK(cache.get_mask_sizes(1, 1).offset == 2);
  cache.reorder_cache(at::tensor({1, 0}, at::kLong));
  const auto k = cache.update(tokens(3, 1).expand({2, 2, 1, 4}), tokens(3, 1).expand({2, 2, 1, 4}), 0).first;
  CHECK(k[0][0][0][0].item<float>() == 100);
  cache.batch_repeat_interleave(2);
  CHECK(cache.layer(2).batch_size() == 4);
  REQUIRE_THROWS_WITH(cache.update(tokens(0, 1), tokens(0, 1), 2), Contains("do not fit the cached"));

  DynamicCache lazy;  // no config: full layers appear as layers use them
  lazy.update(tokens(0, 2), tokens(0, 2), 1);
  CHECK(lazy.size() == 2);
  CHECK(lazy.get_seq_length(1) == 2);
}

TEST_CASE("masks: causal, sliding window, padding and cache offsets", "[masks]") {
  const double low = std::numeric_limits<float>::lowest();
  // 6 queries at positions 4..9 over keys 4..9 (a sliding cache dropped 0..3), window 3, row 1 padded at key 5.
  auto padding = at::ones({2, 10}, at::kLong);
  padding[1][5] = 0;
  const nn::MaskLayout layout{2, 6, 4, MaskSizes{6, 4}, 3};
  const auto mask = nn::attention_mask(padding, layout, at::kFloat);
  REQUIRE(mask.sizes() == at::IntArrayRef({2, 1, 6, 6}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t q = 0; q < 6; ++q) {
      for (int64_t kv = 0; kv < 6; ++kv) {
        const int64_t qi = 4 + q, ki = 4 + kv;
        const bool allowed = ki <= qi && ki > qi - 3 && !(b == 1 && ki == 5);
        INFO("b=" << b << " q=" << qi << " k=" << ki);
        CHECK(mask[b][0][q][kv].item<double>() == (allowed ? 0.0 : low));
      }
    }
  }
  // One query, no padding, every key inside the window: nothing to mask.
  CHECK_FALSE(nn::attention_mask({}, nn::MaskLayout{1, 1, 9, MaskSizes{3, 7}, 3}, at::kFloat).defined());
  CHECK(nn::attention_mask({}, nn::MaskLayout{1, 1, 9, MaskSizes{10, 0}, 3}, at::kFloat).defined());
  REQUIRE_THROWS_WITH(nn::attention_mask(at::ones({2, 5}), layout, at::kFloat),
                      Contains("attention_mask: expected [2, 10] (batch, cached + new tokens), got 2x5"));
}

TEST_CASE("single-row linear (the decoding kernel) equals at::linear", "[linear]") {
  at::manual_seed(0);
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {8, 16}, {13, 35}, {257, 768}, {64, 2048}}) {
    auto w = at::randn({n, k}), b = at::randn({n}), x = at::randn({1, 1, k});
    const auto expected = at::linear(x, w, b);
    const auto actual = nn::linear(x, w, b);
    REQUIRE(actual.sizes() == expected.sizes());
    // Both sum k float32 products, in different orders: rounding grows with k.
    CHECK(testutil::close(fmt::format("linear {}x{}", n, k), actual, expected, {}, 1e-6 * static_cast<double>(k), 1e-5));
  }
  // Each kernel this CPU has, and BLAS, give the same products.
  auto w = at::randn({37, 100}), b = at::randn({37}), x = at::randn({1, 100});
  const auto expected = at::linear(x, w, b);
  for (auto kernel : {nn::DecodeKernel::kAvx512, nn::DecodeKernel::kAvx2, nn::DecodeKernel::kBlas}) {
    const auto previous = nn::set_decode_kernel(kernel);
    const auto actual = nn::linear(x, w, b);
    nn::set_decode_kernel(previous);
    CHECK(testutil::close(fmt::format("linear 37x100 kernel {}", static_cast<int>(kernel)), actual, expected, {}, 1e-4,
                          1e-5));
  }
  // Shapes that are not one row of the weight's width go to LibTorch unchanged.
  CHECK(nn::linear(at::randn({3, 1}), at::randn({4, 1})).sizes() == at::IntArrayRef({3, 4}));
  // With gradients the kernel steps aside and autograd sees a normal product.
  auto wg = at::randn({4, 8}).requires_grad_(), xg = at::randn({1, 8});
  nn::linear(xg, wg).sum().backward();
  CHECK(testutil::close("linear weight grad", wg.grad(), xg.expand({4, 8}), {}, 1e-6, 1e-6));
}

TEST_CASE("several-row linear (oneDNN's sgemm, columns split over threads) equals at::linear", "[linear]") {
  at::manual_seed(0);
  const int threads = at::get_num_threads();
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {2, 1, 1}, {2, 5, 7}, {3, 17, 33}, {4, 100, 64}, {16, 768, 2048}, {128, 768, 768}}) {
    auto w = at::randn({n, k}), b = at::randn({n}), x = at::randn({1, m, k});
    const auto expected = at::linear(x, w, b);
    at::set_num_threads(1);
    const auto one_thread = nn::linear(x, w, b);
    at::set_num_threads(2);
    const auto two_threads = nn::linear(x, w, b);
    at::set_num_threads(threads);
    REQUIRE(one_thread.sizes() == expected.sizes());
    CHECK(testutil::close(fmt::format("linear {}x{}x{}", m, n, k), one_thread, expected, {}, 1e-6 * static_cast<double>(k),
                          1e-5));
    CHECK(testutil::close(fmt::format("linear {}x{}x{}, two threads", m, n, k), two_threads, expected, {},
                          1e-6 * static_cast<double>(k), 1e-5));
#if defined(TORCHPATCH_OPENMP_KERNELS)
    // Each output column is one thread's sgemm whatever the split: the same sums in the same order.
    CHECK(at::equal(one_thread, two_threads));
#endif
  }
  // A transposed (non-contiguous) input, and no bias.
  auto w = at::randn({40, 24}), xt = at::randn({24, 6}).t();
  CHECK(testutil::close("linear of a transposed input", nn::linear(xt, w), at::linear(xt, w), {}, 1e-5, 1e-5));
  // On the system BLAS by choice: LibTorch's own product, exactly.
  auto x = at::randn({5, 24});
  const auto previous = nn::set_matmul_kernel(nn::MatmulKernel::kBlas);
  const auto blas = nn::linear(x, w);
  nn::set_matmul_kernel(previous);
  CHECK(at::equal(blas, at::linear(x, w)));
  // With gradients the product is autograd's.
  auto wg = at::randn({4, 8}).requires_grad_(), xg = at::randn({3, 8});
  nn::linear(xg, wg).sum().backward();
  CHECK(testutil::close("several-row linear weight grad", wg.grad(), xg.sum(0).expand({4, 8}), {}, 1e-5, 1e-5));
}
