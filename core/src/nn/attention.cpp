#include "torchpatch/nn/attention.h"

#include <cmath>

#include <ATen/ATen.h>

#include "torchpatch/models/config.h"
#include "torchpatch/nn/rotary.h"

namespace torchpatch::nn {

namespace {
// [B, nKV, S, hd] -> [B, nKV*groups, S, hd]; head h reads kv head h / groups.
at::Tensor repeat_kv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), n = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, n, groups, s, d}).reshape({b, n * groups, s, d});
}
}  // namespace

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask, double scaling) {
  const int64_t groups = q.size(1) / k.size(1);
  auto key = repeat_kv(k, groups);
  auto value = repeat_kv(v, groups);
  auto scores = at::matmul(q, key.transpose(2, 3)) * scaling;  // [B, nH, Q, KV]
  if (mask.defined()) scores = scores + mask;
  auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, value).transpose(1, 2).contiguous();  // [B, Q, nH, hd]
}

GqaAttention::GqaAttention(const BuildContext& ctx)
    : num_heads(ctx.config.decoder.num_attention_heads),
      num_key_value_heads(ctx.config.decoder.num_key_value_heads),
      head_dim(ctx.config.decoder.head_dim),
      layer_idx(ctx.layer_idx),
      scaling(1.0 / std::sqrt(static_cast<double>(ctx.config.decoder.head_dim))) {
  const auto& cfg = ctx.config.decoder;
  const bool bias = cfg.attention_bias;
  const auto in = cfg.hidden_size;
  q_proj = register_module("q_proj", std::make_shared<Linear>(in, num_heads * head_dim, bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(in, num_key_value_heads * head_dim, bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(in, num_key_value_heads * head_dim, bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(num_heads * head_dim, in, bias));
}

at::Tensor GqaAttention::forward(const at::Tensor& hidden, const AttentionInputs& inputs) {
  return o_proj->forward(grouped_query_attention(q_proj->forward(hidden), k_proj->forward(hidden), v_proj->forward(hidden),
                                                 inputs, shape()));
}

at::Tensor grouped_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionInputs& inputs, const GqaShape& shape) {
  const auto b = q.size(0), len = q.size(1);
  auto query = q.view({b, len, shape.num_heads, shape.head_dim}).transpose(1, 2);  // [B, nH, Q, hd]
  auto key = k.view({b, len, shape.num_key_value_heads, shape.head_dim}).transpose(1, 2);
  auto value = v.view({b, len, shape.num_key_value_heads, shape.head_dim}).transpose(1, 2);
  query = apply_rotary(query, inputs.cos, inputs.sin);
  key = apply_rotary(key, inputs.cos, inputs.sin);
  auto out = eager_attention(query, key, value, inputs.mask, shape.scaling);  // [B, Q, nH, hd]
  return out.reshape({b, len, shape.num_heads * shape.head_dim});
}

}  // namespace torchpatch::nn
