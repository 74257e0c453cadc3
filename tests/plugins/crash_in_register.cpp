// Test plugins "abort_in_register", "segfault_in_register", "exit_in_register" and
// "abort_in_static_init": one source, the way of dying chosen by TORCHPATCH_TEST_CRASH. The host must
// refuse each with its signal or exit status and the phase, and go on.
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "torchpatch/models/llama.h"
#include "torchpatch/plugin_api.h"

namespace {

class CrashingMLP : public torchpatch::llama::LlamaMLP {
 public:
  using LlamaMLP::LlamaMLP;
};

[[maybe_unused]] void die() {
  std::fprintf(stderr, "about to die (%s)\n", TORCHPATCH_TEST_CRASH_NAME);
#if TORCHPATCH_TEST_CRASH == 1
  std::abort();
#elif TORCHPATCH_TEST_CRASH == 2
  volatile int* nowhere = nullptr;
  *nowhere = 1;
#elif TORCHPATCH_TEST_CRASH == 3
  std::exit(0);
#elif TORCHPATCH_TEST_CRASH == 4
  std::abort();
#endif
}

#if TORCHPATCH_TEST_CRASH == 4
const bool died_at_load = (die(), true);
#endif

void register_plugin(torchpatch::Registrar& registrar) {
  registrar.add_replacement<CrashingMLP>("CrashingMLP", {"LlamaMLP"});
#if TORCHPATCH_TEST_CRASH != 4
  die();
#endif
}

}  // namespace

TORCHPATCH_PLUGIN("torchpatch-test-" TORCHPATCH_TEST_CRASH_NAME, "0.1.0", register_plugin)
