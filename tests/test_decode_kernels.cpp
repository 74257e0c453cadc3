// The decoding fast paths against LibTorch's ops: attention over a cache for a few query rows (taken
// whenever no attention weights are asked for) against the matmul path (taken when they are).
#include "test_prelude.h"

#include <limits>
#include <optional>

#include "test_util.h"
#include "torchpatch/nn/attention.h"

using torchpatch::nn::eager_attention;

namespace {

struct AttentionCase {
  int64_t heads, kv_heads, len, kv_len, head_dim;
  bool mask, softcap, strided_cache;
};

}  // namespace

TEST_CASE("attention for a few query rows equals the matmul path: grouped heads, masks, soft-capping, a cache view",
          "[kernels][attention]") {
  at::manual_seed(5);
  const AttentionCase cases[] = {
      {12, 12, 1, 130, 64, false, false, true},  // llama-125m decoding from its cache
      {8, 2, 1, 37, 64, true, false, true},      // grouped-query heads, a padded row
      {4, 2, 3, 9, 80, true, true, false},       // three query rows, a head size that is not a multiple of 16
      {2, 1, 2, 1, 8, false, true, true},        // one cached token, a tiny head
  };
  for (const auto& c : cases) {
    const int64_t batch = 2;
    const auto q = at::randn({batch, c.heads, c.len, c.head_dim});
    // A cache hands out the first kv_len tokens of a longer buffer: not contiguous along the batch.
    auto k = at::randn({batch, c.kv_heads, c.kv_len + (c.strided_cache ? 7 : 0), c.head_dim}).narrow(2, 0, c.kv_len);
    auto v = at::randn(k.sizes()) ;
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
