// Test plugin "register_throws": offers a class, then throws from its register function. The host
// must register nothing of it.
#include <stdexcept>

#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class NeverRegisteredMLP : public torchpatch::llama::LlamaMLP {
 public:
  using LlamaMLP::LlamaMLP;
};

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<NeverRegisteredMLP>("NeverRegisteredMLP", {"LlamaMLP"});
  throw std::runtime_error("boom: cannot initialise");
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-register-throws", "0.1.0", register_plugin)
