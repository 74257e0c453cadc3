// Test plugin "role_mismatch": offers an Attention-role class under the Mlp patch point "LlamaMLP".
#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class MisplacedAttention : public torchpatch::llama::LlamaAttention {
 public:
  using LlamaAttention::LlamaAttention;
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<MisplacedAttention>("MisplacedAttention", {"LlamaMLP"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-role-mismatch", "0.1.0", register_plugin)
