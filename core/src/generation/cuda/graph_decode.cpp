// CUDA graph decoding (generation/static_decode.h): the static step captured once, then replayed.
#include <optional>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include "generation/static_decode.h"
#include "torchpatch/models/pretrained.h"

namespace torchpatch {
namespace {

class CudaGraphDecoder : public StaticDecoder {
 public:
  using StaticDecoder::StaticDecoder;

  at::Tensor step(const at::Tensor& ids) override {
    ids_.copy_(ids.view({-1, 1}));
    if (steps_ > 0 && !graph_ && refusal_.empty()) capture();
    at::Tensor logits;
    if (graph_) {
      graph_->replay();
      logits = captured_logits_;
    } else {
      // The first step (it makes cuBLAS's handles, the rotary table's copy and SDPA's choices), or
      // every step after a capture that failed: the same static step, launched op by op.
      logits = run();
    }
    advance();
    return logits;
  }

 private:
  // Captured on a side stream, as CUDA requires (the legacy default stream cannot be captured), with
  // both streams drained first; replays then run on the current stream, in the program's order.
  // A module that reads a value on the host inside the step (a plugin's, say) makes the capture fail:
  // decoding then goes on without the graph and says why.
  void capture() {
    const auto device = ids_.device();
    auto current = at::cuda::getCurrentCUDAStream(device.index());
    auto side = at::cuda::getStreamFromPool(false, device.index());
    side.synchronize();
    current.synchronize();
    graph_.emplace();
    try {
      const c10::cuda::CUDAStreamGuard guard(side);
      graph_->capture_begin();
      try {
        captured_logits_ = run();
      } catch (...) {
        try {
          graph_->capture_end();  // returns the stream and the allocator to normal; fails itself
        } catch (...) {
        }
        throw;
      }
      graph_->capture_end();
    } catch (const std::exception& e) {
      graph_.reset();
      captured_logits_ = at::Tensor();
      const std::string what = e.what();
      refusal_ = "capturing the step failed (" + what.substr(0, what.find('\n')) + ")";
    }
    side.synchronize();
  }

  std::optional<at::cuda::CUDAGraph> graph_;
  at::Tensor captured_logits_;
};

}  // namespace

std::unique_ptr<StaticDecoder> make_graph_decoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache,
                                                  int64_t capacity, const at::Tensor& mask, const at::Tensor& positions) {
  return std::make_unique<CudaGraphDecoder>(model, std::move(cache), capacity, mask, positions);
}

}  // namespace torchpatch
