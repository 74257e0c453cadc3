// torchpatch save: load a checkpoint (patched or not) and write it back in the hub layout.
#include <iostream>

#include <fmt/format.h>

#include "commands.h"
#include "launch.h"
#include "session.h"
#include "torchpatch/checkpoint/load.h"

namespace torchpatch::cli {

int cmd_save(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.insert(specs.begin() + 1, {{"out", "DIR", "where to write config.json and the safetensors"},
                                   {"max-shard-bytes", "N", "split into shards of at most N bytes (default 5e9)"},
                                   {"dequantize", "", "write quantized weights back in float, without quantization_config"}});
  specs.push_back(tp_option());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("save", "Load a model with any patches and save it in the Hugging Face hub layout: every "
                               "weight conversion is reversed, so the files load anywhere. A quantized model "
                               "(--quantize, or a quantized checkpoint) is written as its blocks with its "
                               "quantization_config, unless --dequantize. Under --tp N the ranks load their "
                               "slices and rank 0 writes the whole model, gathered back from them.",
                       specs);
    return 0;
  }
  if (!args.has("out")) throw UsageError("--out DIR is required");
  checkpoint::SaveOptions options;
  if (args.has("max-shard-bytes")) {
    const auto n = parse_int_list(args.value("max-shard-bytes"), "--max-shard-bytes");
    if (n.size() != 1 || n[0] <= 0) throw UsageError("--max-shard-bytes: expected one positive integer");
    options.max_shard_bytes = n[0];
  }
  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  print_load_report(built);
  options.conversions = &host->registries().conversions();
  options.dequantize = args.flag("dequantize");
  if (const auto group = process_group(); group && group->rank() != 0) {
    // The same gathers as rank 0's save, in the same order; rank 0 alone writes.
    checkpoint::hub_state_dict(*built.model, *options.conversions, !options.dequantize);
    return 0;
  }
  checkpoint::save_pretrained(*built.model, args.value("out"), options);
  std::cout << fmt::format("saved {} ({}) to {}\n", built.model->class_name(), built.source, args.value("out"));
  return 0;
}

}  // namespace torchpatch::cli
