#include "generation/static_decode.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "base/cuda_library.h"
#include "torchpatch/generation/cache.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/models/pretrained.h"

namespace torchpatch {

StaticDecoder::StaticDecoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache, int64_t capacity,
                             const at::Tensor& mask, const at::Tensor& positions)
    : model_(model), cache_(std::move(cache)) {
  const auto on = at::TensorOptions().device(model.device()).dtype(at::kLong);
  const int64_t stored = cache_->get_seq_length();
  const int64_t batch = positions.size(0);
  write_at_ = at::full({1}, stored, on);
  mask_ = at::zeros({batch, capacity}, on);
  if (mask.defined()) {
    mask_.narrow(1, 0, mask.size(1)).copy_(mask);
  } else {
    mask_.narrow(1, 0, stored + 1).fill_(1);
  }
  positions_ = positions.to(on).contiguous().clone();
  ids_ = at::zeros({batch, 1}, on);
  cache_->make_static(capacity, write_at_);
}

at::Tensor StaticDecoder::step(const at::Tensor& ids) {
  ids_.copy_(ids.view({-1, 1}));
  auto logits = run();
  advance();
  return logits;
}

at::Tensor StaticDecoder::run() {
  mask_.index_fill_(1, write_at_, 1);
  ModelInputs in;
  in.input_ids = ids_;
  in.attention_mask = mask_;
  in.position_ids = positions_;
  in.past_key_values = cache_;
  in.logits_to_keep = 1;
  const DeviceMadeInputs trusted;  // generation's own tokens and positions: no values read on the host
  c10::InferenceMode inference;
  return model_.forward(in).logits;
}

void StaticDecoder::advance() {
  ++steps_;
  positions_.add_(1);
  write_at_.add_(1);
}

namespace {
GraphDecoderFactory graph_decoder_factory = nullptr;
}  // namespace

void register_graph_decoder_factory(GraphDecoderFactory factory) { graph_decoder_factory = factory; }

std::unique_ptr<StaticDecoder> make_graph_decoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache,
                                                  int64_t capacity, const at::Tensor& mask, const at::Tensor& positions) {
  load_cuda_library();  // registers the factory, or says why it cannot
  return graph_decoder_factory(model, std::move(cache), capacity, mask, positions);
}

}  // namespace torchpatch
