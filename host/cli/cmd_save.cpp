// torchpatch save: load a checkpoint (patched or not) and write it back in the hub layout.
#include <iostream>

#include <fmt/format.h>

#include "commands.h"
#include "session.h"
#include "torchpatch/checkpoint/load.h"

namespace torchpatch::cli {

int cmd_save(const std::vector<std::string>& argv) {
  refuse_group("save");
  auto specs = model_options();
  specs.insert(specs.begin() + 1, {{"out", "DIR", "where to write config.json and the safetensors"},
                                   {"max-shard-bytes", "N", "split into shards of at most N bytes (default 5e9)"},
                                   {"dequantize", "", "write quantized weights back in float, without quantization_config"}});
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("save", "Load a model with any patches and save it in the Hugging Face hub layout: every "
                               "weight conversion is reversed, so the files load anywhere. A quantized model "
                               "(--quantize, or a quantized checkpoint) is written as its blocks with its "
                               "quantization_config, unless --dequantize.",
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
  checkpoint::save_pretrained(*built.model, args.value("out"), options);
  std::cout << fmt::format("saved {} ({}) to {}\n", built.model->class_name(), built.source, args.value("out"));
  return 0;
}

}  // namespace torchpatch::cli
