// Test plugin "torch_mismatch": a hand-written descriptor with the right plugin ABI but built
// "against" LibTorch 1.12.0. The host must refuse it before calling the register function.
#include <boost/dll/alias.hpp>
#include <torch/version.h>

#include "torchpatch/runtime/registrar.h"
#include "torchpatch/plugin_descriptor.h"

namespace {

const TorchpatchPluginDescriptor* describe_plugin() {
  static const TorchpatchPluginDescriptor descriptor{
      TORCHPATCH_PLUGIN_ABI_VERSION, sizeof(TorchpatchPluginDescriptor), "torchpatch-test-torch-mismatch",
      "0.1.0", 1, 12, 0, _GLIBCXX_USE_CXX11_ABI, "hand-written"};
  return &descriptor;
}

void register_plugin(torchpatch::Registrar&) {
  throw "the host must never call the register function of a LibTorch-mismatched plugin";
}

}  // namespace

BOOST_DLL_ALIAS(describe_plugin, torchpatch_plugin_descriptor)
BOOST_DLL_ALIAS(register_plugin, torchpatch_plugin_register)
