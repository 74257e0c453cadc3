// The decoding fast paths against LibTorch's ops: attention over a cache for a few query rows (taken
// whenever no attention weights are asked for) against the matmul path (taken when they are);
// RMSNorm and the rotary embedding in one pass against their formulas in LibTorch ops.
#include "test_prelude.h"

#include <limits>
#include <optional>

#include "test_util.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/rms_norm.h"
#include "torchpatch/nn/rotary.h"

using torchpatch::nn::eager_attention;

namespace {

struct AttentionCase {
  int64_t heads, kv_heads, len, kv_len, head_dim;
  bool mask, softcap, strided_cache;
};

struct Qkv {
  at::Tensor q, k, v;
};

// Random q [B, nH, Q, hd] and k/v [B, nKV, KV, hd]; with strided_cache, k/v are the first kv_len
// tokens of a longer buffer, as a cache hands them out (not contiguous along the batch).
Qkv random_qkv(const AttentionCase& c, int64_t batch) {
  auto q = at::randn({batch, c.heads, c.len, c.head_dim});
  auto k = at::randn({batch, c.kv_heads, c.kv_len + (c.strided_cache ? 7 : 0), c.head_dim}).narrow(2, 0, c.kv_len);
  auto v = at::randn(k.sizes());
  return {q, k, v};
}

}  // namespace

TEST_CASE("attention for a few query rows equals the matmul path: grouped heads, masks, soft-capping, a cache view",
          "[kernels][attention]") {
  at::manual_seed(5);
  const AttentionCase cases[] = {
      {12, 12, 1, 130, 64, false, false, true},  // llama-125m decoding from its cache
      {8, 2, 1, 37, 64, true, false, true},      // grouped-query heads, a padded row
      {4, 2, 3, 9, 80, true, true, false},       // three query rows, a head size that is not a multiple of 16
      {2, 1, 2, 1, 8, false, true, true},        // one cached token, a tiny head
      {8, 8, 1, 700, 64, true, true, true},      // a long cache (its softmax once went to OpenMP), capped
  };
  for (const auto& c : cases) {
    const int64_t batch = 2;
    const auto [q, k, v] = random_qkv(c, batch);
    at::Tensor mask;
    if (c.mask) {
      mask = at::zeros({batch, 1, c.len, c.kv_len});
      mask.select(0, 1).narrow(-1, 0, c.kv_len / 2).fill_(std::numeric_limits<float>::lowest());  // left padding
    }
    const std::optional<double> softcap = c.softcap ? std::optional<double>(1.5) : std::nullopt;
    at::Tensor weights;
    const auto expected = eager_attention(q, k, v, mask, 0.125, &weights, true, softcap);
    const auto actual = eager_attention(q, k, v, mask, 0.125, nullptr, true, softcap);
    CHECK(testutil::close("attention " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads, " +
                              std::to_string(c.len) + " x " + std::to_string(c.kv_len),
                          actual, expected, {}, 1e-5, 1e-5));
  }
}

TEST_CASE("fused prefill attention equals the eager path: grouped heads, causal and padded masks, a cache view",
          "[kernels][attention]") {
  using torchpatch::nn::PrefillAttention;
  at::manual_seed(6);
  const AttentionCase cases[] = {
      {12, 4, 128, 128, 64, true, false, false},  // llama-125m's prefill, causal with left padding
      {8, 2, 33, 70, 80, true, false, true},      // a chunk after a cache, an odd head size
      {4, 4, 16, 16, 16, false, false, false},    // no mask (an encoder without padding)
  };
  for (const auto& c : cases) {
    const int64_t batch = 2;
    const auto [q, k, v] = random_qkv(c, batch);
    at::Tensor mask;
    if (c.mask) {  // causal over the last len keys, and row 1's first quarter is padding
      const auto lowest = std::numeric_limits<float>::lowest();
      mask = at::full({c.len, c.kv_len}, lowest).triu(c.kv_len - c.len + 1).expand({batch, 1, c.len, c.kv_len}).clone();
      mask.select(0, 1).narrow(-1, 0, c.kv_len / 4).fill_(lowest);
    }
    const auto previous = torchpatch::nn::set_prefill_attention(PrefillAttention::kEager);
    const auto eager = eager_attention(q, k, v, mask, 0.125);
    torchpatch::nn::set_prefill_attention(PrefillAttention::kFused);
    const auto fused = eager_attention(q, k, v, mask, 0.125);
    torchpatch::nn::set_prefill_attention(previous);
    // Rows that are all padding are left out: what attention over nothing gives is no one's reference.
    const auto real_rows = c.mask ? (mask.amax(-1) > std::numeric_limits<float>::lowest()).squeeze(1) : at::Tensor();
    CHECK(testutil::close("fused vs eager " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads, " +
                              std::to_string(c.len) + " x " + std::to_string(c.kv_len),
                          fused.flatten(2), eager.flatten(2), real_rows, 1e-5, 1e-5));  // [B, Q, nH*hd]
  }
}

TEST_CASE("one-pass RMSNorm equals its formula, Llama's and Gemma's forms", "[kernels][rmsnorm]") {
  at::manual_seed(6);
  for (const bool unit_offset : {false, true}) {
    torchpatch::nn::RmsNorm norm(96, 1e-6, unit_offset);
    norm.weight.data().copy_(at::randn({96}));
    const auto x = at::randn({2, 5, 96}) * 3;
    const auto h = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    const auto expected = unit_offset ? h * (1.0 + norm.weight) : norm.weight * h;
    at::NoGradGuard no_grad;
    CHECK(testutil::close(unit_offset ? "rmsnorm (1 + w)" : "rmsnorm w", norm.forward(x), expected, {}, 1e-6, 1e-6));
  }
}

TEST_CASE("one-pass rotary embedding equals x cos + rotate_half(x) sin, full and partial", "[kernels][rope]") {
  at::manual_seed(7);
  for (const int64_t rot : {64, 32}) {
    // [B, Q, H, hd] transposed to [B, H, Q, hd], as attention hands it over
    const auto x = at::randn({2, 3, 4, 64}).transpose(1, 2);
    const auto angles = at::randn({2, 3, rot / 2});
    const auto cos = at::cat({angles, angles}, -1).cos(), sin = at::cat({angles, angles}, -1).sin();
    const auto x_rot = x.narrow(-1, 0, rot);
    const auto rotated = x_rot * cos.unsqueeze(1) +
                         at::cat({-x_rot.narrow(-1, rot / 2, rot / 2), x_rot.narrow(-1, 0, rot / 2)}, -1) * sin.unsqueeze(1);
    const auto expected = rot == 64 ? rotated : at::cat({rotated, x.narrow(-1, rot, 64 - rot)}, -1);
    CHECK(testutil::close("rotary " + std::to_string(rot) + " of 64", torchpatch::nn::apply_rotary(x, cos, sin), expected,
                          {}, 0, 0));
  }
}
