// Test plugin "derived_attention": a replacement for LlamaAttention that derives from the built-in
// class, calls its forward and counts the calls (numerically identical to the built-in).
#include <atomic>

#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class DerivedLlamaAttention : public torchpatch::llama::LlamaAttention {
 public:
  explicit DerivedLlamaAttention(const torchpatch::BuildContext& ctx) : LlamaAttention(ctx) {}

  std::map<std::string, int64_t> counters() const override { return {{"calls", calls_.load()}}; }

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const torchpatch::AttentionInputs& inputs) override {
    ++calls_;
    return LlamaAttention::forward_impl(hidden, inputs);
  }

 private:
  std::atomic<int64_t> calls_{0};
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<DerivedLlamaAttention>("DerivedLlamaAttention", {"LlamaAttention"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-derived-attention", "0.4.0", register_plugin)
