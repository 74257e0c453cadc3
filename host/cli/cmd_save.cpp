// torchpatch save: load a checkpoint (patched or not) and write it back in the hub layout.
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/runtime/gguf_model.h"
#include "commands.h"
#include "launch.h"
#include "progress.h"
#include "session.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::cli {

namespace {

int save_as_gguf(const Args& args, const PluginHost& host, const BuiltModel& built) {
  if (process_group()) throw UsageError("--format gguf is written by one process: run it without --tp");
  if (args.flag("dequantize") && args.has("quantize")) {
    throw UsageError("--format gguf writes a --quantize model as its blocks: leave out --dequantize");
  }
  GgufSaveOptions options;
  options.conversions = &host.registries().conversions();
  if (args.has("model")) {
    if (const auto gguf = checkpoint::gguf_file_of(args.value("model"))) options.gguf_from = *gguf;
  }
  const auto report = save_gguf_model(*built.model, args.value("output"), host.registries().families(), options);
  std::vector<std::string> types;
  for (const auto& [type, count] : report.types) types.push_back(fmt::format("{} {}", count, type));
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"model", built.model->class_name()}, {"source", built.source},
                                {"output", args.value("output")}, {"format", "gguf"}, {"tensors", report.tensors},
                                {"types", report.types}, {"tokenizer", report.tokenizer}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("saved {} ({}) to {} as GGUF: {} tensors ({}); tokenizer: {}\n", built.model->class_name(),
                           built.source, args.value("output"), report.tensors, fmt::join(types, ", "), report.tokenizer);
  return 0;
}

}  // namespace

int cmd_save(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.insert(specs.begin() + 1, {{"output", "DIR", "where to write config.json, the safetensors and the "
                                                     "checkpoint's tokenizer files", false, {"out"}},
                                   {"max-shard-bytes", "SIZE", "split into shards of at most SIZE bytes: 5e9, 5GB, "
                                                               "512MB, 4GiB (default 5GB)"},
                                   {"format", "FORMAT", "hub (the default: a Hugging Face checkpoint directory) or "
                                                        "gguf (one file llama.cpp runs, at --output FILE)"}});
  specs.push_back(tp_option());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("save", "Load a model with any patches and save it in the Hugging Face hub layout: every "
                               "weight conversion is reversed, so the files load anywhere. A quantized model "
                               "(--quantize, or a quantized checkpoint) is written as its blocks with its "
                               "quantization_config, unless --dequantize. Under --tp N the ranks load their "
                               "slices and rank 0 writes the whole model, gathered back from them. --format gguf "
                               "writes llama.cpp's format instead (docs/gguf.md).",
                       specs);
    return 0;
  }
  if (!args.has("output")) throw UsageError("--output DIR is required");
  checkpoint::SaveOptions options;
  options.max_shard_bytes = size_option(args, "max-shard-bytes", options.max_shard_bytes);
  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  if (!args.flag("quiet")) print_load_report(built);
  const auto file_format = args.has("format") ? args.value("format") : std::string("hub");
  if (file_format != "hub" && file_format != "gguf") {
    throw UsageError("--format: '" + printable(file_format) + "' is neither hub nor gguf");
  }
  if (file_format == "gguf") return save_as_gguf(args, *host, built);
  options.conversions = &host->registries().conversions();
  options.dequantize = args.flag("dequantize");
  if (const auto group = process_group(); group && group->rank() != 0) {
    // The same gathers as rank 0's save, in the same order; rank 0 alone writes.
    checkpoint::hub_state_dict(*built.model, *options.conversions, !options.dequantize);
    return 0;
  }
  if (args.has("model")) {  // the tokenizer travels with the weights
    options.companions_from = args.value("model");
    if (const auto gguf = checkpoint::gguf_file_of(args.value("model"))) {
      try {
        options.companion_texts = gguf_tokenizer_files(*gguf);
      } catch (const ConfigError& e) {
        std::cerr << "note: the weights are saved without a tokenizer: " << e.what() << "\n";
      }
    }
  }
  checkpoint::SaveReport report;
  {
    StageProgress progress("saving to " + printable(args.value("output")), shows_progress(args), progress_after(args));
    options.progress = progress.callback();
    report = checkpoint::save_pretrained(*built.model, args.value("output"), options);
  }
  const auto config = built.model->config_json();
  const auto q = config.find("quantization_config");
  const std::string format = q != config.end() && q->is_object() ? q->value("format", "?") : "";
  if (args.flag("json")) {
    auto files = nlohmann::json::array();
    for (const auto& [name, bytes] : report.files) files.push_back({{"name", name}, {"bytes", bytes}});
    std::cout << nlohmann::json{{"model", built.model->class_name()}, {"source", built.source},
                                {"output", args.value("output")}, {"files", files},
                                {"weights", format.empty() || options.dequantize ? "float" : format}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("saved {} ({}) to {}: {}\n", built.model->class_name(), built.source, args.value("output"),
                           report.describe());
  if (!format.empty()) {
    std::cout << (options.dequantize ? fmt::format("weights written in float (dequantized from {})\n", format)
                                     : fmt::format("weights written as {} blocks with their quantization_config "
                                                   "(--dequantize writes float)\n",
                                                   format));
  }
  return 0;
}

}  // namespace torchpatch::cli
