// Internal: decoding over a static cache (GenerationConfig::static_cache), and on CUDA by replaying a
// CUDA graph of the one-token step (generation/cuda/graph_decode.cpp), so that the step costs one
// launch instead of one per operation: decode reads the weights at the memory's speed rather than
// waiting on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "torchpatch/error.h"

namespace torchpatch {

class DynamicCache;
class PretrainedModel;

/// The decoding steps after the prefill, over fixed buffers: the input tokens, their positions, the
/// padding mask over every slot of the static cache, and the slot to write next. A step updates them
/// in place, so nothing changes shape or address from one step to the next.
class StaticDecoder {
 public:
  /// `cache` (after the prefill) becomes static with `capacity` slots (prompt + new tokens); `mask`
  /// [B, P+1] (undefined: no padding) and `positions` [B, 1] are those of the first step to decode,
  /// whose keys go to slot P.
  StaticDecoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache, int64_t capacity, const at::Tensor& mask,
                const at::Tensor& positions);
  virtual ~StaticDecoder() = default;
  StaticDecoder(const StaticDecoder&) = delete;
  StaticDecoder& operator=(const StaticDecoder&) = delete;

  /// Logits [B, 1, V] of the step whose input tokens are `ids` [B, 1] (on the model's device).
  virtual at::Tensor step(const at::Tensor& ids);

 protected:
  /// One step over the buffers as they are, operation by operation.
  at::Tensor run();
  /// The next step's position and slot.
  void advance();

  PretrainedModel& model_;
  std::shared_ptr<DynamicCache> cache_;
  at::Tensor ids_, positions_, mask_, write_at_;
  int64_t steps_ = 0;
};

/// A StaticDecoder whose first step runs eagerly (it makes cuBLAS's handles, the rotary table's copy
/// and SDPA's choices), whose second is captured in a CUDA graph, and whose later steps replay it. A
/// step that cannot be captured (a module reads a value on the host) is a DeviceError that says so.
/// The decoder lives in libtorchpatch_cuda (generation/cuda/graph_decode.cpp), loaded here if needed.
std::unique_ptr<StaticDecoder> make_graph_decoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache,
                                                  int64_t capacity, const at::Tensor& mask, const at::Tensor& positions);

/// What make_graph_decoder calls: libtorchpatch_cuda registers it as it loads (base/cuda_library.h).
using GraphDecoderFactory = std::unique_ptr<StaticDecoder> (*)(PretrainedModel&, std::shared_ptr<DynamicCache>,
                                                               int64_t, const at::Tensor&, const at::Tensor&);
void register_graph_decoder_factory(GraphDecoderFactory factory);

}  // namespace torchpatch
