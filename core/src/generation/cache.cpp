#include "torchpatch/generation/cache.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"

namespace torchpatch {

namespace {
void check_kv(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& stored) {
  // Keys and values may differ in their last size (multi-head latent attention: q/k heads hold the
  // rotary part too, value heads do not).
  if (keys.dim() != 4 || values.dim() != 4 || values.size(0) != keys.size(0) || values.size(1) != keys.size(1) ||
      values.size(2) != keys.size(2)) {
    throw InputError(fmt::format("cache update: keys and values must be [B, nKV, S, hd] and [B, nKV, S, vd], got {} and {}",
                                 fmt::join(keys.sizes(), "x"), fmt::join(values.sizes(), "x")));
  }
  if (stored.defined() && (keys.size(0) != stored.size(0) || keys.size(1) != stored.size(1) ||
                           keys.size(3) != stored.size(3) || keys.scalar_type() != stored.scalar_type())) {
    throw InputError(fmt::format("cache update: keys {} ({}) do not fit the cached {} ({})", fmt::join(keys.sizes(), "x"),
                                 c10::toString(keys.scalar_type()), fmt::join(stored.sizes(), "x"),
                                 c10::toString(stored.scalar_type())));
  }
}
}  // namespace

CacheLayer::~CacheLayer() = default;

std::pair<at::Tensor, at::Tensor> CacheLayer::append(const at::Tensor& keys, const at::Tensor& values,
                                                     int64_t keep_from) {
  check_kv(keys, values, keys_);
  const int64_t fresh = keys.size(2);
  const int64_t capacity = keys_.defined() ? keys_.size(2) : 0;
  if (stored_ + fresh > capacity) {
    const int64_t kept = stored_ - keep_from;
    if (keys_.defined() && kept + fresh <= capacity) {
      // Slide the kept tokens to the front (a sliding layer's window, small next to the storage).
      if (kept > 0) {
        keys_.narrow(2, 0, kept).copy_(keys_.narrow(2, keep_from, kept).clone());
        values_.narrow(2, 0, kept).copy_(values_.narrow(2, keep_from, kept).clone());
      }
    } else {
      const int64_t grown = std::max({2 * capacity, kept + fresh, reserved_});
      auto shape = keys.sizes().vec(), value_shape = values.sizes().vec();
      shape[2] = value_shape[2] = grown;
      auto new_keys = at::empty(shape, keys.options());
      auto new_values = at::empty(value_shape, values.options());
      if (kept > 0) {
        new_keys.narrow(2, 0, kept).copy_(keys_.narrow(2, keep_from, kept));
        new_values.narrow(2, 0, kept).copy_(values_.narrow(2, keep_from, kept));
      }
      keys_ = new_keys;
      values_ = new_values;
    }
    stored_ = kept;
    keep_from = 0;
  }
  keys_.narrow(2, stored_, fresh).copy_(keys);
  values_.narrow(2, stored_, fresh).copy_(values);
  stored_ += fresh;
  return {keys_.narrow(2, keep_from, stored_ - keep_from), values_.narrow(2, keep_from, stored_ - keep_from)};
}

void CacheLayer::select_batch(const at::Tensor& indices) {
  if (!keys_.defined()) return;
  const auto idx = indices.to(at::kLong);
  keys_ = keys_.index_select(0, idx);
  values_ = values_.index_select(0, idx);
}

void CacheLayer::reserve(int64_t tokens) { reserved_ = std::max<int64_t>(tokens, 0); }

void CacheLayer::reset() { stored_ = 0; }

int64_t CacheLayer::batch_size() const { return keys_.defined() ? keys_.size(0) : -1; }

// Full layer ------------------------------------------------------------------------------------

std::pair<at::Tensor, at::Tensor> DynamicLayer::update(const at::Tensor& keys, const at::Tensor& values) {
  return append(keys, values, /*keep_from=*/0);
}

void DynamicLayer::crop(int64_t max_length) {
  if (max_length < 0) max_length = stored_ + max_length;
  stored_ = std::clamp<int64_t>(max_length, 0, stored_);
}

// Sliding-window layer --------------------------------------------------------------------------

SlidingWindowLayer::SlidingWindowLayer(int64_t window) : window_(window) {
  if (window < 1) throw ConfigError(fmt::format("sliding window must be positive, got {}", window));
}

std::pair<at::Tensor, at::Tensor> SlidingWindowLayer::update(const at::Tensor& keys, const at::Tensor& values) {
  // Only the last window-1 tokens can still be attended to by a new query.
  const int64_t visible = std::min(stored_, window_ - 1);
  // Storage beyond about two windows only delays the next slide; a long reservation is not needed.
  reserved_ = std::min(reserved_, keys.size(2) + 2 * window_);
  auto kv = append(keys, values, stored_ - visible);
  seen_ += keys.size(2);
  return kv;
}

void SlidingWindowLayer::reset() {
  CacheLayer::reset();
  seen_ = 0;
}

MaskSizes SlidingWindowLayer::mask_sizes(int64_t q_len) const {
  const int64_t offset = std::max<int64_t>(seen_ - window_ + 1, 0);
  const int64_t length = seen_ >= window_ ? window_ - 1 + q_len : seen_ + q_len;
  return {length, offset};
}

void SlidingWindowLayer::crop(int64_t max_length) {
  if (seen_ >= window_) {
    throw InputError(fmt::format("cannot crop a sliding-window cache layer after it has seen {} tokens (window {}): "
                                 "the tokens it dropped are lost",
                                 seen_, window_));
  }
  if (max_length < 0) max_length = stored_ + max_length;
  stored_ = seen_ = std::clamp<int64_t>(max_length, 0, stored_);
}

// Static layer ----------------------------------------------------------------------------------

StaticLayer::StaticLayer(CacheLayer& layer, int64_t capacity, at::Tensor write_at)
    : capacity_(capacity), write_at_(std::move(write_at)) {
  if (!layer.keys_.defined() || layer.stored_ > capacity) {
    throw InputError(fmt::format("static cache: {} stored tokens do not fit {} slots", layer.stored_, capacity));
  }
  auto shape = layer.keys_.sizes().vec(), value_shape = layer.values_.sizes().vec();
  shape[2] = value_shape[2] = capacity;
  keys_ = at::zeros(shape, layer.keys_.options());
  values_ = at::zeros(value_shape, layer.values_.options());
  keys_.narrow(2, 0, layer.stored_).copy_(layer.keys_.narrow(2, 0, layer.stored_));
  values_.narrow(2, 0, layer.stored_).copy_(layer.values_.narrow(2, 0, layer.stored_));
  stored_ = capacity;
}

std::pair<at::Tensor, at::Tensor> StaticLayer::update(const at::Tensor& keys, const at::Tensor& values) {
  check_kv(keys, values, keys_);
  if (keys.size(2) != 1) {
    throw InputError(fmt::format("static cache: updates one token at a time, got {}", keys.size(2)));
  }
  keys_.index_copy_(2, write_at_, keys);
  values_.index_copy_(2, write_at_, values);
  return {keys_, values_};
}

void StaticLayer::crop(int64_t) { throw InputError("static cache: a static layer cannot be cropped"); }

// The cache -------------------------------------------------------------------------------------

DynamicCache::DynamicCache(const DecoderConfig& config) {
  for (const auto& type : config.layer_types) {
    if (type == kSlidingAttention) {
      layers_.push_back(std::make_unique<SlidingWindowLayer>(config.sliding_window.value_or(0)));
    } else {
      layers_.push_back(std::make_unique<DynamicLayer>());
    }
  }
}

std::pair<at::Tensor, at::Tensor> DynamicCache::update(const at::Tensor& keys, const at::Tensor& values,
                                                       int64_t layer_idx) {
  if (layer_idx < 0) throw InputError(fmt::format("cache update: layer index {} is negative", layer_idx));
  while (static_cast<int64_t>(layers_.size()) <= layer_idx) {
    layers_.push_back(std::make_unique<DynamicLayer>());
    layers_.back()->reserve(reserve_);
  }
  return layers_[layer_idx]->update(keys, values);
}

int64_t DynamicCache::get_seq_length(int64_t layer_idx) const {
  return layer_idx >= 0 && layer_idx < static_cast<int64_t>(layers_.size()) ? layers_[layer_idx]->seq_length() : 0;
}

MaskSizes DynamicCache::get_mask_sizes(int64_t q_len, int64_t layer_idx) const {
  if (layer_idx < 0 || layer_idx >= static_cast<int64_t>(layers_.size())) return {q_len, 0};
  return layers_[layer_idx]->mask_sizes(q_len);
}

void DynamicCache::crop(int64_t max_length) {
  for (auto& layer : layers_) layer->crop(max_length);
}

void DynamicCache::reorder_cache(const at::Tensor& beam_idx) { batch_select_indices(beam_idx); }

void DynamicCache::batch_select_indices(const at::Tensor& indices) {
  for (auto& layer : layers_) layer->select_batch(indices);
}

void DynamicCache::batch_repeat_interleave(int64_t repeats) {
  // Every layer holds the same batch; read it from the first one that has storage.
  int64_t batch = -1;
  for (const auto& layer : layers_) {
    batch = layer->batch_size();
    if (batch >= 0) break;
  }
  if (batch < 0) return;
  batch_select_indices(at::arange(batch, at::kLong).repeat_interleave(repeats));
}

void DynamicCache::reserve(int64_t tokens) {
  reserve_ = tokens;
  for (auto& layer : layers_) layer->reserve(tokens);
}

void DynamicCache::make_static(int64_t capacity, const at::Tensor& write_at) {
  for (auto& layer : layers_) {
    if (layer->sliding_window()) throw InputError("static cache: a sliding-window layer cannot be made static");
    layer = std::make_unique<StaticLayer>(*layer, capacity, write_at);
  }
}

void DynamicCache::reset() {
  for (auto& layer : layers_) layer->reset();
}

}  // namespace torchpatch
