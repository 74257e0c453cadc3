// Test plugin "invalid_regex": declares the key "Llama(Attention", which is not a valid regex.
#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class BadPatternAttention : public torchpatch::llama::LlamaAttention {
 public:
  using LlamaAttention::LlamaAttention;
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<BadPatternAttention>("BadPatternAttention", {"Llama(Attention"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-invalid-regex", "0.1.0", register_plugin)
