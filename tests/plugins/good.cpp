// Test plugin "good": a drop-in replacement for LlamaMLP that derives from the built-in class and
// counts its calls.
#include <atomic>

#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class CountingLlamaMLP : public torchpatch::llama::LlamaMLP {
 public:
  explicit CountingLlamaMLP(const torchpatch::BuildContext& ctx) : LlamaMLP(ctx) {}

  at::Tensor forward(const at::Tensor& x) override {
    ++calls_;
    return LlamaMLP::forward(x);
  }

  std::map<std::string, int64_t> counters() const override { return {{"calls", calls_.load()}}; }

 private:
  std::atomic<int64_t> calls_{0};
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<CountingLlamaMLP>("CountingLlamaMLP", {"LlamaMLP"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-good", "1.2.3", register_plugin)
