// The plugin descriptor: a plain C struct the host reads before any C++ object crosses the boundary.
// Deliberately free of C++ and LibTorch types, so a plugin of any build can be checked safely.
#pragma once

#include <stdint.h>

#include "torchpatch/version.h"

/// Bumped whenever a type that crosses the plugin boundary changes (roles, ModuleClass, Registrar).
#define TORCHPATCH_PLUGIN_ABI_VERSION 2  // 2: ModuleClass::devices

/// Exported names of the two entry points.
#define TORCHPATCH_DESCRIPTOR_SYMBOL "torchpatch_plugin_descriptor"
#define TORCHPATCH_REGISTER_SYMBOL "torchpatch_plugin_register"

extern "C" {

struct TorchpatchPluginDescriptor {
  uint32_t abi_version;  ///< TORCHPATCH_PLUGIN_ABI_VERSION the plugin was built with
  uint32_t struct_size;  ///< sizeof(TorchpatchPluginDescriptor) in the plugin's build
  const char* name;      ///< unique plugin name, e.g. "custom-llama-attention"
  const char* version;   ///< plugin version, e.g. "1.0.0"
  int32_t torch_major;   ///< LibTorch version the plugin was compiled against
  int32_t torch_minor;
  int32_t torch_patch;
  int32_t cxx11_abi;     ///< _GLIBCXX_USE_CXX11_ABI of the plugin's build
  const char* compiler;  ///< compiler id and version, for messages
  int32_t torchpatch_major;  ///< TORCHPATCH_VERSION_* the plugin was compiled against
  int32_t torchpatch_minor;
  int32_t torchpatch_patch;
};

typedef const TorchpatchPluginDescriptor* (*TorchpatchDescribeFn)();
}
