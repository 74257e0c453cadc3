// Sentence embeddings as sentence-transformers makes them from an encoder's token states: the
// modules listed in a checkpoint's modules.json (Transformer -> Pooling -> Normalize), read from the
// checkpoint directory and applied to the model's last hidden state.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <optional>

#include <ATen/core/Tensor.h>

namespace torchpatch {

/// What follows the encoder in a sentence-transformers checkpoint.
struct TORCHPATCH_API SentencePooling {
  enum class Mode {
    kMean,  ///< the mean of the real tokens' states (pooling_mode_mean_tokens)
    kCls,   ///< the first token's state (pooling_mode_cls_token)
    kMax,   ///< each feature's largest value over the real tokens (pooling_mode_max_tokens)
  };
  Mode mode = Mode::kMean;
  bool normalize = false;  ///< a Normalize module: each embedding scaled to unit L2 norm
};

/// The pooling of the sentence-transformers checkpoint in `dir`, from its modules.json and its Pooling
/// module's config.json; nullopt when `dir` has no modules.json (not a sentence-transformers
/// checkpoint). A module or pooling mode torchpatch does not implement is a ConfigError naming it.
TORCHPATCH_API std::optional<SentencePooling> read_sentence_pooling(const std::filesystem::path& dir);

/// One embedding a row: `hidden` [B, T, H] pooled over the tokens whose `attention_mask` [B, T] is 1
/// (all of them when the mask is undefined) -> [B, H], in float32 arithmetic as sentence-transformers.
TORCHPATCH_API at::Tensor pool_sentences(const at::Tensor& hidden, const at::Tensor& attention_mask,
                                         const SentencePooling& pooling);

}  // namespace torchpatch
