// Roles: the abstract interfaces a patch point can be filled with. LibTorch modules have no virtual
// forward, so each role declares one; built-in classes and replacements derive from a role.
#pragma once

#include "torchpatch/export.h"

#include <ATen/core/Tensor.h>

#include "torchpatch/patching/module_class.h"

namespace torchpatch {

class DynamicCache;

/// What a decoder layer hands its attention: rotary tables, the mask of its kind of layer (full or
/// sliding), and the key/value cache, computed once per forward.
struct TORCHPATCH_API AttentionInputs {
  at::Tensor cos;           ///< [B, Q, rot_dim] rotary cosines (attention scaling applied)
  at::Tensor sin;           ///< [B, Q, rot_dim] rotary sines
  at::Tensor mask;          ///< [B, 1, Q, KV] additive float mask (0 or dtype min); undefined = none
  at::Tensor position_ids;  ///< [B, Q] int64
  DynamicCache* cache = nullptr;  ///< append this layer's keys/values and attend over all; null = no cache
  int64_t layer_idx = -1;         ///< the layer being run (its slot in the cache)
  /// When set, the attention stores its probabilities [B, nH, Q, KV] here (for the "attentions" output).
  at::Tensor* weights_out = nullptr;
};

/// What a router returns, in Hugging Face's tuple order: (router_logits, router_scores, router_indices).
struct TORCHPATCH_API RouterOutput {
  at::Tensor logits;   ///< [T, E] raw logits, activation dtype
  at::Tensor scores;   ///< [T, K] weights of the chosen experts, activation dtype
  at::Tensor indices;  ///< [T, K] int64 chosen experts, most probable first
};

namespace roles {

/// Decoder self-attention: hidden [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API Attention : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Attention";
  ~Attention() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) = 0;
};

/// Feed-forward block: [..., H] -> [..., H].
class TORCHPATCH_API Mlp : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Mlp";
  ~Mlp() override;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

/// Normalisation over the last dimension: [..., H] -> [..., H].
class TORCHPATCH_API Norm : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Norm";
  ~Norm() override;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

/// One decoder layer: hidden [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API DecoderLayer : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "DecoderLayer";
  ~DecoderLayer() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs) = 0;
};

/// MoE router: tokens [T, H] -> which experts, with which weights.
class TORCHPATCH_API Router : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Router";
  ~Router() override;
  virtual RouterOutput forward(const at::Tensor& hidden) = 0;
};

/// MoE experts: tokens [T, H], chosen experts [T, K] and their weights [T, K] -> [T, H], the
/// weighted sum of each token's experts.
class TORCHPATCH_API Experts : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Experts";
  ~Experts() override;
  virtual at::Tensor forward(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) = 0;
};

}  // namespace roles
}  // namespace torchpatch
