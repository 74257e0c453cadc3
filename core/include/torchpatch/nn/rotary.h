// Rotary position embeddings (RoPE): inverse frequencies per variant, cos/sin tables, rotation.
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <mutex>
#include <utility>

#include <ATen/core/Tensor.h>

#include "torchpatch/models/config.h"

namespace torchpatch::nn {

/// inv_freq [rot_dim/2] (float32) after the variant's scaling, and the factor cos/sin are scaled by.
struct TORCHPATCH_API RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};

/// Hugging Face's ROPE_INIT_FUNCTIONS: "default", "linear", "dynamic" (NTK), "llama3" and "yarn",
/// with `partial_rotary_factor`. `seq_len` matters only to "dynamic": the longest sequence seen.
/// Throws ConfigError for a variant it does not know.
TORCHPATCH_API RopeFrequencies rope_frequencies(const DecoderConfig& config, int64_t seq_len = 0);

/// Holds inv_freq (not part of the state dict, as in Hugging Face) and computes cos/sin tables.
/// The "dynamic" variant recomputes inv_freq when positions pass the longest length seen so far and
/// returns to the original frequencies when sequences are short again (Hugging Face's
/// `dynamic_rope_update`); that state is guarded, so threads may share one embedding.
class TORCHPATCH_API RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  explicit RotaryEmbedding(const DecoderConfig& config);

  /// position_ids [B, Q] -> (cos, sin), each [B, Q, rot_dim], computed in float32, cast to `dtype`.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& position_ids, c10::ScalarType dtype);

  const at::Tensor& inv_freq() const { return freq_.inv_freq; }
  double attention_scaling() const { return freq_.attention_scaling; }

 private:
  /// Grows or resets the dynamic frequencies for `seq_len` positions; returns the ones to use.
  RopeFrequencies dynamic_update(int64_t seq_len);

  DecoderConfig config_;
  RopeFrequencies freq_;
  RopeFrequencies original_;
  int64_t max_seq_len_cached_ = 0;
  std::shared_ptr<std::mutex> dynamic_mutex_;
};

/// x [B, heads, Q, hd] rotated by cos/sin [B, Q, rot_dim] (half-split rotate_half); dimensions past
/// rot_dim pass through unchanged (partial rotary).
TORCHPATCH_API at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace torchpatch::nn
