// Test plugin "sleep_in_register": its register function never returns in time. A probe with a
// short timeout must kill it and refuse it.
#include <chrono>
#include <thread>

#include "torchpatch/plugin_api.h"

namespace {

void register_plugin(torchpatch::Registrar&) { std::this_thread::sleep_for(std::chrono::seconds(60)); }

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-sleep-in-register", "0.1.0", register_plugin)
