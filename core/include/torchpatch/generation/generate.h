// Autoregressive generation with a key/value cache: greedy or sampled, batched with left padding.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/models/pretrained.h"

namespace torchpatch {

/// Where a generation run is; handed to GenerationConfig::on_step after every token.
struct TORCHPATCH_API GenerationProgress {
  int64_t step;            ///< tokens generated so far per row
  int64_t max_new_tokens;
  double elapsed_seconds;  ///< since the run started
  std::vector<int64_t> tokens;  ///< the token each row just got (pad_token_id for a row that had stopped)
  std::vector<bool> finished;   ///< per row: stopped at an end token (this step or before)
};

/// How to pick tokens, as Hugging Face's GenerationConfig (same defaults where it has them).
struct TORCHPATCH_API GenerationConfig {
  int64_t max_new_tokens = 20;
  bool do_sample = false;    ///< false: greedy (argmax); true: sample from the processed distribution
  double temperature = 1.0;  ///< sampling: logits are divided by it (> 0)
  int64_t top_k = 50;        ///< sampling: keep the k most likely tokens (0 = all)
  double top_p = 1.0;        ///< sampling: keep the smallest set whose probability reaches top_p (1 = all)
  std::optional<uint64_t> seed;  ///< sampling: a fixed seed makes runs reproducible
  std::vector<int64_t> eos_token_ids;  ///< a row stops after producing one of these (empty = never)
  int64_t pad_token_id = 0;  ///< what a stopped row gets while others go on
  bool output_logits = false;  ///< keep each step's raw next-token logits
  std::vector<std::string> outputs;  ///< named outputs to capture at every step (see ModelInputs::outputs)
  std::function<void(const GenerationProgress&)> on_step;  ///< called after each generated token
  /// Called with each step's chosen tokens [B] (int64, contiguous) before anything uses them, to
  /// replace them in place: a group of processes gives every rank rank 0's choice (a broadcast), so
  /// sampling agrees even where the ranks' random states do not.
  std::function<void(at::Tensor& tokens)> agree_tokens;
  /// Decode over a static cache of prompt + max_new_tokens slots (Hugging Face's
  /// cache_implementation="static"): nothing changes shape from one step to the next. Where the model
  /// cannot (GenerationOutput::static_refusal says why), the dynamic cache decodes.
  bool static_cache = false;
  /// On CUDA: decode over a static cache by replaying a CUDA graph of the one-token step, where the
  /// model allows it; false: one forward pass per step, launched op by op.
  bool cuda_graph = true;
};

struct TORCHPATCH_API GenerationOutput {
  /// [B, prompt + new] int64 on the host: the prompt (as given, padding included), then new tokens
  at::Tensor sequences;
  std::vector<at::Tensor> logits;  ///< per step, [B, V] float on the host (with output_logits)
  /// Per step (0 = the prompt), the captured outputs by name (with GenerationConfig::outputs). The
  /// steps run under c10::InferenceMode, so these are inference tensors: clone one before changing
  /// it in place outside InferenceMode.
  std::vector<std::map<std::string, std::vector<at::Tensor>>> captured;
  int64_t prompt_tokens = 0;       ///< B * prompt length
  int64_t new_tokens = 0;          ///< tokens generated per row
  double prefill_seconds = 0;      ///< first forward over the prompts, and the first token
  double decode_seconds = 0;       ///< every later token
  bool static_cache = false;       ///< decoding used a static cache
  bool cuda_graph = false;         ///< decoding replayed a CUDA graph
  /// Why the static cache or the CUDA graph that was wanted (static_cache; cuda_graph on CUDA) was
  /// not used, e.g. "a mixture-of-experts model (its routing reads expert indices on the host)";
  /// "" when it was, or when neither was wanted.
  std::string static_refusal;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;  ///< B * (new_tokens - 1) / decode_seconds
};

/// Generates up to `config.max_new_tokens` tokens after `input_ids` [B, P] (int64). `attention_mask`
/// [B, P] marks real tokens (1) and left padding (0); undefined = no padding. The model must have a
/// language-model head. Throws InputError for an empty prompt, a bad token id, a sequence longer than
/// the model's positions, or bad sampling settings.
TORCHPATCH_API GenerationOutput generate(PretrainedModel& model, const at::Tensor& input_ids,
                                         const at::Tensor& attention_mask, const GenerationConfig& config = {});

/// The positions of a left-padded batch: cumsum(mask) - 1, with padding at 1 (what Hugging Face passes).
TORCHPATCH_API at::Tensor positions_from_mask(const at::Tensor& attention_mask);

/// Applies temperature, top-k and top-p to next-token logits [B, V] (float), in Hugging Face's order;
/// removed tokens get -inf.
TORCHPATCH_API at::Tensor process_logits(const at::Tensor& logits, const GenerationConfig& config);

}  // namespace torchpatch
