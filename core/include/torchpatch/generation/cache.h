// The key/value cache of cached decoding: Hugging Face's DynamicCache, one layer object per decoder
// layer, full or sliding-window. Storage is preallocated and grows by doubling, so appending a token
// writes one slot instead of copying the whole cache.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/models/config.h"
#include "torchpatch/nn/masks.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch {

using nn::MaskSizes;

/// One layer's cache. Keys/values are [B, nKV, S, hd], after RoPE and before heads are repeated.
class TORCHPATCH_API CacheLayer {
 public:
  friend class StaticLayer;
  virtual ~CacheLayer();

  /// Appends k/v [B, nKV, S_new, hd] and returns the keys/values to attend over (views of the storage).
  virtual std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values) = 0;
  /// Tokens seen so far (a sliding layer counts all of them, not just the ones it keeps).
  virtual int64_t seq_length() const = 0;
  /// Keys the next update's result will span for `q_len` new tokens, and their first position.
  virtual MaskSizes mask_sizes(int64_t q_len) const = 0;
  /// The window, for a sliding layer.
  virtual std::optional<int64_t> sliding_window() const { return std::nullopt; }
  /// Drops tokens past `max_length` (negative: counts from the end).
  virtual void crop(int64_t max_length) = 0;
  /// Whether it keeps a fixed number of slots (StaticLayer).
  virtual bool is_static() const { return false; }

  /// Keeps batch rows `indices` (int64 [B']), in that order: beam reordering, filtering, repeating.
  void select_batch(const at::Tensor& indices);
  /// Room for `tokens` stored tokens without growing.
  void reserve(int64_t tokens);
  /// Forgets everything (storage is kept for reuse).
  virtual void reset();
  /// Batch size of the stored keys; -1 before the first update.
  int64_t batch_size() const;

 protected:
  /// Appends to the storage, growing it when full; returns the stored [start, end) as views.
  std::pair<at::Tensor, at::Tensor> append(const at::Tensor& keys, const at::Tensor& values, int64_t keep_from);
  at::Tensor keys_;    ///< [B, nKV, capacity, hd]
  at::Tensor values_;  ///< [B, nKV, capacity, hd]
  int64_t stored_ = 0;  ///< tokens in keys_[:, :, :stored_]
  int64_t reserved_ = 0;
};

/// Keeps every token: update returns all P + S_new keys.
class TORCHPATCH_API DynamicLayer : public CacheLayer {
 public:
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values) override;
  int64_t seq_length() const override { return stored_; }
  MaskSizes mask_sizes(int64_t q_len) const override { return {stored_ + q_len, 0}; }
  void crop(int64_t max_length) override;
};

/// Keeps the last window-1 tokens; update returns those plus the new ones (Hugging Face's
/// DynamicSlidingWindowLayer), so a query sees at most `window` keys including itself.
class TORCHPATCH_API SlidingWindowLayer : public CacheLayer {
 public:
  explicit SlidingWindowLayer(int64_t window);
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values) override;
  int64_t seq_length() const override { return seen_; }
  MaskSizes mask_sizes(int64_t q_len) const override;
  std::optional<int64_t> sliding_window() const override { return window_; }
  /// Throws once the window has been passed: the dropped tokens cannot come back.
  void crop(int64_t max_length) override;
  void reset() override;

 private:
  int64_t window_;
  int64_t seen_ = 0;  ///< all tokens ever appended; the stored ones are the last min(seen_, window-1)
};

/// A fixed number of slots, each update of one token written at the slot the device-side index
/// `write_at` (int64 [1]) holds: the form a CUDA graph can replay, since neither a size nor a host
/// value changes from one step to the next. update returns every slot; which ones hold tokens is the
/// attention mask's business, so a query is taken to stand after all of them: seq_length is
/// capacity - 1 and mask_sizes spans the capacity.
class TORCHPATCH_API StaticLayer : public CacheLayer {
 public:
  /// Takes over what `layer` stored (its first `stored` slots), in `capacity` slots.
  StaticLayer(CacheLayer& layer, int64_t capacity, at::Tensor write_at);
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values) override;
  int64_t seq_length() const override { return capacity_ - 1; }
  MaskSizes mask_sizes(int64_t q_len) const override { return {capacity_, 0}; }
  /// Throws: slots are freed by the caller's mask, not by cropping.
  void crop(int64_t max_length) override;
  bool is_static() const override { return true; }

 private:
  int64_t capacity_;
  at::Tensor write_at_;
};

/// A cache for every layer of a model. Built from a config it holds one layer per `layer_types`
/// entry; built empty it adds full layers as layers first update it.
class TORCHPATCH_API DynamicCache : public AttentionCache {
 public:
  DynamicCache() = default;
  explicit DynamicCache(const DecoderConfig& config);

  /// Appends layer `layer_idx`'s new keys/values; returns what that layer attends over.
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& keys, const at::Tensor& values, int64_t layer_idx) override;
  /// Tokens seen by layer `layer_idx` (0 for a layer not yet used).
  int64_t get_seq_length(int64_t layer_idx = 0) const override;
  bool is_static(int64_t layer_idx) const override {
    return layer_idx >= 0 && layer_idx < static_cast<int64_t>(layers_.size()) && layers_[layer_idx]->is_static();
  }
  MaskSizes get_mask_sizes(int64_t q_len, int64_t layer_idx) const;

  void crop(int64_t max_length);
  void reorder_cache(const at::Tensor& beam_idx);
  void batch_select_indices(const at::Tensor& indices);
  void batch_repeat_interleave(int64_t repeats);
  void reserve(int64_t tokens);
  void reset();
  /// Turns every layer into a StaticLayer of `capacity` slots written at `write_at` (CUDA graph
  /// decoding); throws for a sliding-window layer, whose window moves.
  void make_static(int64_t capacity, const at::Tensor& write_at);

  size_t size() const { return layers_.size(); }
  CacheLayer& layer(size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::unique_ptr<CacheLayer>> layers_;
  int64_t reserve_ = 0;
};

}  // namespace torchpatch
