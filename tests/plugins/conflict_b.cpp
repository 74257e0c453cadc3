// Test plugin "conflict_b": declares LlamaMLP, as conflict_a does, with another class.
#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class ConflictMlpB : public torchpatch::llama::LlamaMLP {
 public:
  using LlamaMLP::LlamaMLP;
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<ConflictMlpB>("ConflictMlpB", {"LlamaMLP"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-conflict-b", "0.1.0", register_plugin)
