// Rotary position embeddings (RoPE): inverse frequencies per variant, cos/sin tables, rotation.
#pragma once

#include "torchpatch/export.h"

#include <memory>
#include <mutex>
#include <utility>

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torchpatch::nn {

/// The RoPE variants, resolved from `rope_type` when the config is read.
enum class RopeKind { kDefault, kLinear, kDynamic, kLlama3, kYarn, kLongrope };

/// Rotary embedding parameters after the legacy `rope_theta` / `rope_scaling` fields were merged.
struct TORCHPATCH_API RopeParameters {
  std::string rope_type = "default";  ///< as the config names it: "default", "linear", "dynamic", "llama3", "yarn", "longrope"
  RopeKind kind = RopeKind::kDefault;  ///< what rope_type means
  double theta = 10000.0;
  double factor = 1.0;  ///< context extension factor (linear, dynamic, llama3, yarn)
  double low_freq_factor = 1.0;   ///< llama3
  double high_freq_factor = 4.0;  ///< llama3
  int64_t original_max_position_embeddings = 0;  ///< llama3 (required), yarn (optional), longrope; 0 = not given
  double partial_rotary_factor = 1.0;
  // yarn
  std::optional<double> attention_factor;  ///< overrides the computed cos/sin scaling
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  bool truncate = true;  ///< round the correction range to whole dimensions
  // longrope (Phi-3): per-dimension divisors of the frequencies, short and long contexts
  std::vector<double> short_factor;  ///< [rot_dim/2], for sequences up to original_max_position_embeddings
  std::vector<double> long_factor;   ///< [rot_dim/2], for longer ones
};

/// What the rotary embedding of a model needs.
struct TORCHPATCH_API RopeOptions {
  RopeParameters rope;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
};

/// inv_freq [rot_dim/2] (float32) after the variant's scaling, and the factor cos/sin are scaled by.
struct TORCHPATCH_API RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};

/// Hugging Face's ROPE_INIT_FUNCTIONS: "default", "linear", "dynamic" (NTK), "llama3" and "yarn",
/// "longrope", with `partial_rotary_factor`. `seq_len` matters to "dynamic" (the longest sequence
/// seen) and "longrope" (long factors past original_max_position_embeddings).
TORCHPATCH_API RopeFrequencies rope_frequencies(const RopeOptions& options, int64_t seq_len = 0);

/// Holds inv_freq (not part of the state dict, as in Hugging Face) and computes cos/sin tables.
/// "longrope" chooses short or long factors per forward from that forward's longest position.
/// The "dynamic" variant recomputes inv_freq when positions pass the longest length seen so far and
/// returns to the original frequencies when sequences are short again (Hugging Face's
/// `dynamic_rope_update`); that state is guarded, so threads may share one embedding.
class TORCHPATCH_API RotaryEmbedding {
 public:
  RotaryEmbedding() = default;
  explicit RotaryEmbedding(const RopeOptions& options);

  /// position_ids [B, Q] -> (cos, sin), each [B, Q, rot_dim], computed in float32 on position_ids'
  /// device, cast to `dtype`.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& position_ids, c10::ScalarType dtype);

  const at::Tensor& inv_freq() const { return freq_.inv_freq; }
  double attention_scaling() const { return freq_.attention_scaling; }

 private:
  /// Grows or resets the dynamic frequencies for `seq_len` positions; returns the ones to use.
  RopeFrequencies dynamic_update(int64_t seq_len);
  /// `inv_freq` on `device`: copied once and kept (a copy per call would stall a device's stream).
  at::Tensor inv_freq_on(const at::Tensor& inv_freq, c10::Device device);

  RopeOptions options_;
  RopeFrequencies freq_;
  RopeFrequencies original_;
  RopeFrequencies long_;             // longrope: the frequencies past longrope_threshold_ positions
  int64_t longrope_threshold_ = 0;
  int64_t max_seq_len_cached_ = 0;
  std::shared_ptr<std::mutex> dynamic_mutex_;
  at::Tensor device_source_, device_inv_freq_;  // the last copy inv_freq_on made, and what it copied
};

/// x [B, heads, Q, hd] rotated by cos/sin [B, Q, rot_dim] (half-split rotate_half); dimensions past
/// rot_dim pass through unchanged (partial rotary).
TORCHPATCH_API at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace torchpatch::nn
