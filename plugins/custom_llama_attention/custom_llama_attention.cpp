// custom-llama-attention: the quick-start example of Hugging Face's patching docs in C++. A subclass
// of the built-in LlamaAttention that counts its calls and otherwise behaves exactly like it.
#include <atomic>

#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class CustomLlamaAttention : public torchpatch::llama::LlamaAttention {
 public:
  explicit CustomLlamaAttention(const torchpatch::BuildContext& ctx) : LlamaAttention(ctx) {}

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
  // LibTorch's operations only, so it runs wherever the model does.
  registrar.add_replacement<CustomLlamaAttention>("CustomLlamaAttention", {"LlamaAttention"}, {c10::kCPU, c10::kCUDA});
}

}  // namespace

TORCHPATCH_PLUGIN("custom-llama-attention", "1.0.0", register_plugin)
