// Roles: the abstract interfaces a patch point can be filled with. LibTorch modules have no virtual
// forward, so each role declares one; built-in classes and replacements derive from a role.
#pragma once

#include "torchpatch/export.h"

#include <utility>

#include <ATen/core/Tensor.h>

#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// What an attention needs of a key/value cache (nn::DynamicCache is the built-in one).
class TORCHPATCH_API AttentionCache {
 public:
  virtual ~AttentionCache();
  /// Appends layer `layer_idx`'s new keys/values [B, nKV, S_new, hd]; returns what the layer attends over.
  virtual std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values,
                                                   int64_t layer_idx) = 0;
  /// Tokens layer `layer_idx` has seen (0 for a layer not yet used).
  virtual int64_t get_seq_length(int64_t layer_idx = 0) const = 0;
  /// Whether layer `layer_idx` keeps a fixed number of slots (a static cache: its length does not
  /// grow as it is updated).
  virtual bool is_static(int64_t layer_idx) const { return false; }
};

/// What a decoder layer hands its attention: rotary tables, the mask of its kind of layer (full or
/// sliding), and the key/value cache, computed once per forward.
struct TORCHPATCH_API AttentionInputs {
  at::Tensor cos;           ///< [B, Q, rot_dim] rotary cosines (attention scaling applied)
  at::Tensor sin;           ///< [B, Q, rot_dim] rotary sines
  at::Tensor mask;          ///< [B, 1, Q, KV] additive float mask (0 or dtype min); undefined = none
  at::Tensor position_ids;  ///< [B, Q] int64
  AttentionCache* cache = nullptr;  ///< append this layer's keys/values and attend over all; null = no cache
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

// Roles with a contract (Attention, DecoderLayer, Router, Experts) have a non-virtual `forward` that
// does what every implementation owes its callers, around the protected virtual `forward_impl` that
// implementations override. Mlp and Norm owe nothing beyond their result.

/// Decoder self-attention: hidden [B, Q, H] -> [B, Q, H].
class TORCHPATCH_API Attention : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Attention";
  ~Attention() override;
  /// Runs forward_impl; asks it for the attention probabilities while outputs are captured and
  /// reports (output, probabilities) as outputs 0 and 1; checks that it appended exactly this call's
  /// tokens to `inputs.cache` (PatchError naming the class otherwise: every later step would forget).
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs);

 protected:
  /// Appends to inputs.cache (when set) and fills *inputs.weights_out (when set) with [B, nH, Q, KV].
  virtual at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) = 0;
};

/// Feed-forward block: [..., H] -> [..., H].
class TORCHPATCH_API Mlp : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Mlp";
  ~Mlp() override;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

/// A projection: [..., in_features] -> [..., out_features]. Every Linear of every family is built
/// through the patch point "Linear" (nn::Linear is the built-in class), so quantizers and sharded
/// projections are ordinary replacements. Its constructor arguments arrive as ctx.args
/// {"in_features", "out_features", "bias"}.
class TORCHPATCH_API Linear : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Linear";
  ~Linear() override;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
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
  /// Runs forward_impl and reports its output (output 0) to output capture.
  at::Tensor forward(const at::Tensor& hidden, const AttentionInputs& inputs);

 protected:
  virtual at::Tensor forward_impl(const at::Tensor& hidden, const AttentionInputs& inputs) = 0;
};

/// MoE router: tokens [T, H] -> which experts, with which weights.
class TORCHPATCH_API Router : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Router";
  ~Router() override;
  /// Runs forward_impl and reports (logits, scores, indices) as outputs 0, 1 and 2.
  RouterOutput forward(const at::Tensor& hidden);

 protected:
  virtual RouterOutput forward_impl(const at::Tensor& hidden) = 0;
};

/// MoE experts: tokens [T, H], chosen experts [T, K] and their weights [T, K] -> [T, H], the
/// weighted sum of each token's experts.
class TORCHPATCH_API Experts : public PatchableModule {
 public:
  static constexpr const char* kRoleName = "Experts";
  ~Experts() override;
  /// Checks indices/weights [T, K] against hidden [T, H] and `num_experts` (InputError naming the
  /// fault), runs forward_impl and reports its output (output 0).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights);

 protected:
  virtual at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) = 0;
  /// How many experts this module holds (indices must be below it); 0 = unchecked.
  virtual int64_t expert_count() const { return 0; }
};

}  // namespace roles
}  // namespace torchpatch
