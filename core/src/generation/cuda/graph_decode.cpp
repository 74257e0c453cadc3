// CUDA graph decoding (generation/static_decode.h): the static step captured once, then replayed.
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include "generation/static_decode.h"
#include "torchpatch/error.h"
#include "torchpatch/models/pretrained.h"

namespace torchpatch {
namespace {

class CudaGraphDecoder : public StaticDecoder {
 public:
  using StaticDecoder::StaticDecoder;

  at::Tensor step(const at::Tensor& ids) override {
    // The first step eagerly: it makes cuBLAS's handles, the rotary table's copy and SDPA's choices.
    if (steps_ == 0) return StaticDecoder::step(ids);
    ids_.copy_(ids.view({-1, 1}));
    if (!graph_) capture();
    graph_->replay();
    advance();
    return captured_logits_;
  }

 private:
  // Captured on a side stream, as CUDA requires (the legacy default stream cannot be captured), with
  // both streams drained first; replays then run on the current stream, in the program's order.
  void capture() {
    const auto device = ids_.device();
    auto current = at::cuda::getCurrentCUDAStream(device.index());
    auto side = at::cuda::getStreamFromPool(false, device.index());
    side.synchronize();
    current.synchronize();
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    try {
      const c10::cuda::CUDAStreamGuard guard(side);
      graph->capture_begin();
      try {
        captured_logits_ = run();
      } catch (...) {
        try {
          graph->capture_end();  // gives the stream back; fails itself
        } catch (...) {
        }
        throw;
      }
      graph->capture_end();
    } catch (const std::exception& e) {
      // A module that reads a value on the host inside the step (a plugin's, say) cannot be captured.
      // The failed graph is left alive on purpose: LibTorch's allocator may still hold a reference to
      // it, and freeing it would leave that dangling for the rest of the process.
      (void)graph.release();
      const std::string what = e.what();
      throw DeviceError("decoding on " + device.str() + ": capturing the one-token step in a CUDA graph failed (" +
                        what.substr(0, what.find('\n')) +
                        "): a module of this model reads a value on the host while it runs; --no-cuda-graph "
                        "(GenerationConfig::cuda_graph = false) decodes without the graph");
    }
    side.synchronize();
    graph_ = std::move(graph);
  }

  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  at::Tensor captured_logits_;
};

std::unique_ptr<StaticDecoder> make_cuda_graph_decoder(PretrainedModel& model, std::shared_ptr<DynamicCache> cache,
                                                       int64_t capacity, const at::Tensor& mask, const at::Tensor& positions) {
  return std::make_unique<CudaGraphDecoder>(model, std::move(cache), capacity, mask, positions);
}

const bool registered = (register_graph_decoder_factory(&make_cuda_graph_decoder), true);

}  // namespace

}  // namespace torchpatch
