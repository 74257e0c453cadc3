// Training losses: next-token and masked-token cross-entropy and the MoE load-balancing auxiliary loss.
#pragma once

#include "torchpatch/export.h"

#include <vector>

#include <ATen/core/Tensor.h>

namespace torchpatch::nn {

/// Hugging Face's ForCausalLMLoss: logits [B, T, V] (upcast to float32) predict labels [B, T] shifted
/// by one; label -100 is ignored; the mean over the remaining positions.
TORCHPATCH_API at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

/// Hugging Face's masked-LM loss (BertForMaskedLM): logits [B, T, V] predict labels [B, T] at the same
/// position; label -100 is ignored; the mean over the remaining positions.
TORCHPATCH_API at::Tensor masked_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

/// Hugging Face's load_balancing_loss_func: router logits of every sparse layer (each [B*T, E]),
/// top-k routing recomputed from their softmax; num_experts * sum(fraction of tokens per expert *
/// mean router probability per expert). `attention_mask` [B, T] leaves padding out (undefined: all).
TORCHPATCH_API at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts,
                                              int64_t top_k, const at::Tensor& attention_mask = {});

}  // namespace torchpatch::nn
