// Test plugin "abi_mismatch": a hand-written descriptor claiming plugin ABI version 99. The host must
// refuse it after reading the descriptor, before calling anything else.
#include <boost/dll/alias.hpp>
#include <torch/version.h>

#include "torchpatch/runtime/registrar.h"
#include "torchpatch/plugin_descriptor.h"

namespace {

const TorchpatchPluginDescriptor* describe_plugin() {
  static const TorchpatchPluginDescriptor descriptor{
      99, sizeof(TorchpatchPluginDescriptor), "torchpatch-test-abi-mismatch", "9.9.9",
      TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, _GLIBCXX_USE_CXX11_ABI,
      "hand-written"};
  return &descriptor;
}

void register_plugin(torchpatch::Registrar&) {
  throw "the host must never call the register function of an ABI-mismatched plugin";
}

}  // namespace

BOOST_DLL_ALIAS(describe_plugin, torchpatch_plugin_descriptor)
BOOST_DLL_ALIAS(register_plugin, torchpatch_plugin_register)
