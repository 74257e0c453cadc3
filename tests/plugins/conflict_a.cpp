// Test plugin "conflict_a": declares LlamaMLP, as conflict_b does (loaded first: sorted by name).
#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class ConflictMlpA : public torchpatch::llama::LlamaMLP {
 public:
  using LlamaMLP::LlamaMLP;
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<ConflictMlpA>("ConflictMlpA", {"LlamaMLP"});
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-conflict-a", "0.1.0", register_plugin)
