// Embedding the plugin host: load plugins, choose a replacement, build a model and run it.
#include <filesystem>
#include <iostream>

#include <ATen/ATen.h>

#include "torchpatch/runtime/auto.h"
#include "torchpatch/plugin_host.h"

int main(int argc, char** argv) {
  if (argc > 2) {
    std::cerr << "usage: embed_host [PLUGIN_DIR]   (default: the bundled plugins of the torchpatch it runs on)\n";
    return 2;
  }
  // A catalogue: classes are offered by name; PluginMode::DropIn would register their keys at once.
  torchpatch::PluginHost host;
  host.load_directory(argc == 2 ? std::filesystem::path(argv[1]) : torchpatch::bundled_plugin_dir(),
                      torchpatch::PluginMode::Catalogue);
  for (const auto& plugin : host.plugins()) {
    std::cout << plugin.status_name() << " " << plugin.path.string() << " " << plugin.reason << "\n";
  }

  host.patch("LlamaAttention", "CustomLlamaAttention");  // register the choice in the global registry
  auto model = torchpatch::from_config(torchpatch::preset_config("tiny-llama"));  // applies the registry
  torchpatch::init_random_weights(*model, /*seed=*/0);

  torchpatch::ModelInputs inputs;
  inputs.input_ids = at::tensor({1, 2, 3, 4}, at::kLong).unsqueeze(0);
  at::NoGradGuard no_grad;
  std::cout << "logits " << model->forward(inputs).logits.sizes() << "\n";

  for (const auto& point : model->patch_points()) {
    const auto& record = point.module->patch_record();
    if (!record.patched()) continue;
    std::cout << point.path << ": " << record.key << " -> " << record.class_name << " ("
              << record.origin.describe() << "), calls=" << point.module->counters()["calls"] << "\n";
  }
  return 0;
}
