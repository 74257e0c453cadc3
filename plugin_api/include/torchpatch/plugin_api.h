// The one header a plugin needs. A plugin defines a register function and names it in
// TORCHPATCH_PLUGIN; the host checks the descriptor, then calls the function with a Registrar.
//
//   class CustomLlamaAttention : public torchpatch::llama::LlamaAttention { ... };
//   void register_plugin(torchpatch::Registrar& r) {
//     r.add_replacement<CustomLlamaAttention>("CustomLlamaAttention", {"LlamaAttention"});
//   }
//   TORCHPATCH_PLUGIN("custom-llama-attention", "1.0.0", register_plugin)
//
// Do no work in static initialisers: everything happens in the register function, which may throw.
#pragma once

#include <boost/dll/alias.hpp>
#include <torch/version.h>

#include "torchpatch/export.h"
#include "torchpatch/runtime/registrar.h"
#include "torchpatch/plugin_descriptor.h"

namespace torchpatch {
using RegisterFn = void (*)(Registrar&);
}  // namespace torchpatch

#if defined(__clang__)
#define TORCHPATCH_COMPILER_ID "clang " __clang_version__
#elif defined(__GNUC__)
#define TORCHPATCH_COMPILER_ID "gcc " __VERSION__
#else
#define TORCHPATCH_COMPILER_ID "unknown"
#endif

/// Declares the plugin's entry points: its descriptor and its register function `REGISTER_FN`.
#define TORCHPATCH_PLUGIN(NAME, VERSION, REGISTER_FN)                                               \
  namespace {                                                                                      \
  const TorchpatchPluginDescriptor* torchpatch_describe_plugin() {                                 \
    static const TorchpatchPluginDescriptor descriptor{                                           \
        TORCHPATCH_PLUGIN_ABI_VERSION, sizeof(TorchpatchPluginDescriptor), NAME, VERSION,         \
        TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, _GLIBCXX_USE_CXX11_ABI,     \
        TORCHPATCH_COMPILER_ID,    TORCHPATCH_VERSION_MAJOR, TORCHPATCH_VERSION_MINOR,            \
        TORCHPATCH_VERSION_PATCH};                                                                 \
    return &descriptor;                                                                            \
  }                                                                                                \
  void torchpatch_register_plugin(::torchpatch::Registrar& registrar) { REGISTER_FN(registrar); } \
  }                                                                                                \
  BOOST_DLL_ALIAS(torchpatch_describe_plugin, torchpatch_plugin_descriptor)                        \
  BOOST_DLL_ALIAS(torchpatch_register_plugin, torchpatch_plugin_register)
