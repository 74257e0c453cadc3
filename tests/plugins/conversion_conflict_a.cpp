// Test plugin "conversion_conflict_a": registers weight conversions for the model type
// "conversion_conflict_type", as conversion_conflict_b does; the second one loaded is refused.
#include "torchpatch/plugin_api.h"

namespace {

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_conversion("conversion_conflict_type", [](const torchpatch::Config&) {
    return torchpatch::checkpoint::ConversionRules{torchpatch::checkpoint::WeightRenaming{"old_a", "new_a"}};
  });
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-conversion-conflict-a", "0.1.0", register_plugin)
