// Test plugin "version_mismatch": a hand-written descriptor built against torchpatch 0.1.0. The host
// (0.2 or later) must refuse it, naming both versions, before calling anything else.
#include <boost/dll/alias.hpp>
#include <torch/version.h>

#include "torchpatch/plugin_descriptor.h"
#include "torchpatch/runtime/registrar.h"

namespace {

const TorchpatchPluginDescriptor* describe_plugin() {
  static const TorchpatchPluginDescriptor descriptor{
      TORCHPATCH_PLUGIN_ABI_VERSION, sizeof(TorchpatchPluginDescriptor), "torchpatch-test-version-mismatch", "0.1.0",
      TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, _GLIBCXX_USE_CXX11_ABI, "hand-written", 0, 1, 0};
  return &descriptor;
}

void register_plugin(torchpatch::Registrar&) {
  throw "the host must never call the register function of a plugin built against another torchpatch";
}

}  // namespace

BOOST_DLL_ALIAS(describe_plugin, torchpatch_plugin_descriptor)
BOOST_DLL_ALIAS(register_plugin, torchpatch_plugin_register)
