#include "session.h"

#include "progress.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/dist/process_group.h"
#include "torchpatch/models/family.h"
#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/runtime/gguf_model.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/class_table.h"
#include "torchpatch/patching/roles.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/device.h"
#include "torchpatch/printable.h"

namespace torchpatch::cli {

std::vector<OptionSpec> plugin_options() {
  return {
      {"plugin-dir", "DIR", "load every plugin in DIR as a drop-in (also $TORCHPATCH_PLUGIN_PATH)", true},
      {"strict", "", "a refused plugin, a patch key that matches nothing or a weight that is not finite is an error"},
      {"allow-world-writable", "", "load plugins from files or directories anyone may write"},
      {"no-probe", "", "load drop-in plugins straight away, without first trying each in a child process"},
      {"json", "", "print JSON"},
      {"quiet", "", "print no warnings, notes or progress on stderr (errors still)"},
      {"progress", "", "show the progress of loading and saving from the start (by default: of a stage past 2 s)"},
      {"help", "", "show this help"},
  };
}

std::vector<OptionSpec> model_options() {
  auto specs = plugin_options();
  specs.insert(specs.begin(),
               {{"model", "DIR", "Hugging Face checkpoint directory (config.json + model.safetensors), or a GGUF file "
                         "(docs/gguf.md)"},
                {"preset", "NAME", fmt::format("built-in model with fixed random weights ({}; plugin families add "
                                               "theirs, `torchpatch plugins` lists them)",
                                               fmt::join(preset_names(), ", "))},
                {"patch", "KEY=CLASS", "replace patch point KEY (class name or regex) with CLASS", true},
                {"dtype", "TYPE", "parameter dtype: float32 (default), bfloat16 or float16"},
                {"device", "DEVICE", "where the model runs: cpu (default), cuda or cuda:N (a CUDA build and an NVIDIA GPU)"},
                {"quantize", "FORMAT", "quantize projections and MoE experts to q8_0 or q4_0 as they load (GGUF's blocks; "
                                       "the bundled plugin 'quantized')"},
                {"keep-float", "PATTERN", "with --quantize: keep the modules whose path matches PATTERN in float "
                                          "(e.g. lm_head, '*.mlp.down_proj')", true},
                {"experts", "IMPL", "MoE experts implementation: grouped (default) or eager"},
                {"copy-weights", "", "copy the weights out of the memory-mapped checkpoint into the process's own "
                                     "memory: a slower load, a faster decode"},
                {"dequantize", "", "compute in float: a GGUF file's quantized projections are dequantized as they "
                                   "load (save: quantized weights are written back in float)"},
                {"allow-incomplete", "", "load a checkpoint with missing, unexpected or mismatched tensors and report them"},
                {"no-memory-check", "", "build a model even if its parameters need more than this machine's memory"},
                {"threads", "N", "intra-op threads (default: LibTorch's, one per core; bench: 1)"}});
  return specs;
}

std::unique_ptr<PluginHost> open_plugin_host(const Args& args, bool warn_refused) {
  PluginHostOptions options;
  options.strict = args.flag("strict");
  options.allow_world_writable = args.flag("allow-world-writable");
  options.probe = args.flag("no-probe") ? PluginProbe::Off : args.flag("probe") ? PluginProbe::All : PluginProbe::DropIns;
  options.probe_cache = default_probe_cache();
  if (options.probe == PluginProbe::Off) {
    options.before_unprobed_load = [](const std::filesystem::path& file) {
      std::cerr << "torchpatch: loading plugin " << printable(file.string()) << " without a probe (--no-probe)\n"
                << std::flush;
    };
  }
  auto host = std::make_unique<PluginHost>(options, default_registries());
  load_plugins(*host, args, warn_refused);
  return host;
}

void load_plugins(PluginHost& host, const Args& args, bool warn_refused) {
  const auto bundled = bundled_plugin_dir();
  std::error_code ec;
  if (!bundled.empty() && std::filesystem::is_directory(bundled, ec)) host.load_directory(bundled, PluginMode::Catalogue);
  if (const char* env = std::getenv("TORCHPATCH_PLUGIN_PATH")) host.load_path_list(env);
  // --plugin-dir is resolved against the current directory here, explicitly; the host refuses relative paths.
  for (const auto& dir : args.values("plugin-dir")) {
    if (dir.empty()) throw UsageError("--plugin-dir: the path is empty");
    host.load_directory(std::filesystem::absolute(dir), PluginMode::DropIn);
  }
  for (const auto& p : host.refused()) {
    if (!warn_refused) break;
    std::cerr << "torchpatch: warning: plugin " << printable(p.path.string()) << " refused: " << printable(p.reason)
              << "\n";
  }
}

void apply_patch_args(PluginHost& host, const Args& args) {
  for (const auto& patch : args.values("patch")) {
    const auto eq = patch.rfind('=');  // class names hold no '=', patterns may: (?=...)
    if (eq == std::string::npos || eq == 0 || eq + 1 == patch.size()) {
      throw UsageError(fmt::format("--patch '{}': expected KEY=CLASS", patch));
    }
    host.patch(patch.substr(0, eq), patch.substr(eq + 1));
  }
}

nlohmann::json quantization_config_for(const std::string& format_name, const std::vector<std::string>& keep_float) {
  const auto format = nn::parse_quant_format(format_name);
  if (!format || !nn::quantizes_to(*format)) {
    throw UsageError(fmt::format("--quantize: '{}' is not one of q8_0, q4_0", format_name));
  }
  // llama.cpp's defaults: every projection quantized, Q4_0 keeping lm_head at Q8_0; the shared
  // expert's one-row gate, like routers and norms (not Linear patch points), stays in float.
  std::vector<std::string> keep{"shared_expert_gate"};
  keep.insert(keep.end(), keep_float.begin(), keep_float.end());
  nlohmann::json config{{"quant_method", "ggml"}, {"format", nn::format_name(*format)}, {"modules_to_not_convert", keep}};
  config["module_formats"] = nlohmann::json::object();
  if (*format == nn::QuantFormat::kQ4_0) config["module_formats"]["lm_head"] = "q8_0";
  return config;
}

PretrainedOptions pretrained_options(const Args& args, const PluginHost& host) {
  PretrainedOptions options;
  options.registries = host.registries();
  if (args.has("dtype")) {
    const auto name = args.value("dtype");
    if (name == "float32") options.dtype = at::kFloat;
    else if (name == "bfloat16") options.dtype = at::kBFloat16;
    else if (name == "float16") options.dtype = at::kHalf;
    else throw UsageError("--dtype: '" + name + "' is not one of float32, bfloat16, float16");
  }
  if (args.has("device")) {
    try {
      options.device = parse_device(args.value("device"));
    } catch (const DeviceError& e) {
      throw UsageError(std::string("--device: ") + e.what());
    }
  }
  if (args.has("experts")) {
    const auto impl = args.value("experts");
    if (impl != "grouped" && impl != "eager") throw UsageError("--experts: '" + impl + "' is not one of grouped, eager");
    options.config_overrides["experts_implementation"] = impl;
  }
  if (args.has("quantize")) {
    options.config_overrides["quantization_config"] = quantization_config_for(args.value("quantize"), args.values("keep-float"));
  } else if (!args.values("keep-float").empty()) {
    throw UsageError("--keep-float: only with --quantize");
  }
  options.strict = !args.flag("allow-incomplete");
  options.reject_non_finite = args.flag("strict");
  options.check_memory = !args.flag("no-memory-check");
  options.copy_weights = args.flag("copy-weights");
  options.dequantize = args.flag("dequantize");
  return options;
}

std::shared_ptr<dist::ProcessGroup> process_group() {
  static const auto group = []() -> std::shared_ptr<dist::ProcessGroup> {
    const auto options = dist::options_from_environment();
    if (!options || options->world_size == 1) return nullptr;
    auto joined = dist::ProcessGroup::join(*options);
    // Rank 0 reports; the others' standard output goes nowhere (their errors still reach stderr).
    if (joined->rank() != 0) std::freopen("/dev/null", "w", stdout);
    // Active for the process's life: the parallel classes read it when built, their conversion
    // rules when the model loads and again when it saves (gathering the slices).
    static const dist::ActiveGroup active(joined);
    return joined;
  }();
  return group;
}

namespace {
// The bundled plugin's class for each kind of block it splits (models/family.h's block_kind).
const std::map<std::string, std::string>& parallel_classes() {
  static const std::map<std::string, std::string> classes{
      {block_kind::kAttention, "TensorParallelAttention"},
      {block_kind::kQkNormAttention, "TensorParallelQkNormAttention"},
      {block_kind::kProjectionQkNormAttention, "TensorParallelProjectionQkNormAttention"},
      {block_kind::kFusedQkvAttention, "TensorParallelFusedQkvAttention"},
      {block_kind::kMlp, "TensorParallelMLP"},
      {block_kind::kFusedMlp, "TensorParallelFusedMLP"},
      {block_kind::kExperts, "ExpertParallelExperts"},
      {block_kind::kSparseBlock, "ExpertParallelBlock"}};
  return classes;
}

bool is_parallel_class(const std::string& name) {
  for (const auto& [kind, cls] : parallel_classes()) {
    if (cls == name) return true;
  }
  return false;
}

// "llama, mistral, ..." : the families whose attention splits.
std::string splitting_families(const FamilyRegistry& families) {
  std::vector<std::string> names;
  for (const auto& family : families.all()) {
    if (!family->decoder) continue;
    if (parallel_classes().count(family->kind_of(family->decoder->attention))) names.push_back(family->model_type);
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

// Under a group, a model whose attention did not become a split class would run whole on every rank
// and sum its output N times: refused, naming the class and its family.
void require_split_attention(const BuiltModel& built, const Registries& registries) {
  const auto& families = registries.families();
  if (std::none_of(built.plan.begin(), built.plan.end(),
                   [](const PlanEntry& entry) { return is_parallel_class(entry.record.class_name); })) {
    throw ConfigError(fmt::format("{}: nothing of it splits between processes (no patch point of it is a kind of "
                                  "block the tensor-parallel plugin splits; the families that split: {})",
                                  built.model->class_name(), splitting_families(families)));
  }
  for (const auto& entry : built.plan) {
    const auto& record = entry.record;
    if (!record.built() || is_parallel_class(record.class_name)) continue;
    const auto builtin = registries.classes().find(record.key);
    if (!builtin || builtin->role != roles::Attention::kRoleName) continue;
    const auto& family = built.model->config().family;
    throw ConfigError(fmt::format("{}: its attention {} ({}) does not split between processes ({}); the families "
                                  "that split: {}; run it without --tp",
                                  built.model->class_name(), record.key,
                                  family ? "family " + family->model_type : "no family",
                                  builtin->kind.empty() ? "it is no shared block the tensor-parallel plugin knows"
                                                        : "the tensor-parallel plugin has no class for its kind '" +
                                                              builtin->kind + "'",
                                  splitting_families(families)));
  }
}
}  // namespace

namespace {
// `--name VALUE` or `--name=VALUE` among the command's arguments, before any "--".
std::optional<std::string> raw_option(const std::vector<std::string>& args, const std::string& name) {
  for (auto it = args.begin(); it != args.end() && *it != "--"; ++it) {
    if (*it == name && it + 1 != args.end()) return *(it + 1);
    if (it->rfind(name + "=", 0) == 0) return it->substr(name.size() + 1);
  }
  return std::nullopt;
}

// The built-in family a --model directory or --preset names; nullptr when that is for the ranks to
// find out (a plugin's family, a file that does not read: each rank then says so).
std::shared_ptr<const Family> family_named_by(const std::vector<std::string>& args) {
  const auto& families = global_families();
  if (const auto preset = raw_option(args, "--preset")) {
    for (const auto& family : families.all()) {
      for (const auto& [name, config] : family->presets) {
        if (name == *preset) return family;
      }
    }
    return nullptr;
  }
  const auto model = raw_option(args, "--model");
  if (!model) return nullptr;
  const auto file = std::filesystem::path(*model) / "config.json";
  std::error_code error;
  if (!std::filesystem::is_regular_file(file, error)) return nullptr;
  try {
    const auto config = read_json_file(file, [](const std::string& message) { throw ConfigError(message); });
    const auto type = config.is_object() ? config.find("model_type") : config.end();
    if (type == config.end() || !type->is_string()) return nullptr;
    return families.find(type->get<std::string>());
  } catch (const ConfigError&) {
    return nullptr;
  }
}
}  // namespace

void refuse_unsplit_before_launch(const std::vector<std::string>& args) {
  // A --patch or a plugin directory may give the attention a class of its own: the ranks decide.
  for (const char* option : {"--patch", "--plugin-dir", "--class"}) {
    if (raw_option(args, option)) return;
  }
  const auto family = family_named_by(args);
  if (!family || !family->decoder) return;
  const auto kind = family->kind_of(family->decoder->attention);
  if (parallel_classes().count(kind)) return;
  throw ConfigError(fmt::format("{}: its attention {} (family {}) does not split between processes ({}); the "
                                "families that split: {}; run it without --tp",
                                family->default_class, family->decoder->attention, family->model_type,
                                kind.empty() ? "it is no shared block the tensor-parallel plugin knows"
                                             : "the tensor-parallel plugin has no class for its kind '" + kind + "'",
                                splitting_families(global_families())));
}

std::optional<ScopedPatchMapping> parallel_patches(PluginHost& host) {
  if (!process_group()) return std::nullopt;
  // By kind: the families say what each patch point is, the plugin how each kind splits.
  PatchMapping::Items items;
  for (const auto& [kind, name] : parallel_classes()) {
    auto found = host.find_class(name);
    if (!found) throw UsageError("running as a group of processes needs the bundled plugin 'tensor-parallel'");
    items.emplace_back(PatchMapping::kind_key(kind), *found);
  }
  return std::optional<ScopedPatchMapping>(std::in_place, items, false, host.registries().patches());
}

namespace {
// A --patch key or --keep-float pattern that matched nothing: the model runs without what the user
// asked for, so every command says so (rank 0 alone), and --strict makes it an error.
void warn_unmatched(const BuiltModel& built, const Args& args) {
  std::set<std::string> patched;
  for (const auto& patch : args.values("patch")) patched.insert(patch.substr(0, patch.rfind('=')));
  std::vector<std::string> messages;
  for (const auto& u : built.unmatched) {
    if (!patched.count(u.key)) continue;
    messages.push_back(fmt::format("--patch key '{}' matched no patch point of {}{}; it runs without that patch",
                                   printable(u.key), built.model->class_name(), u.suggestion.empty() ? "" : "; " + u.suggestion));
  }
  for (const auto& u : unmatched_paths(args.values("keep-float"), built.plan)) {
    messages.push_back(fmt::format("--keep-float '{}' matched no module of {}{}; nothing more is kept in float",
                                   printable(u.key), built.model->class_name(), u.suggestion.empty() ? "" : "; " + u.suggestion));
  }
  if (messages.empty()) return;
  if (args.flag("strict")) throw ConfigError("--strict: " + messages.front());
  if (args.flag("quiet")) return;
  if (const auto group = process_group(); group && group->rank() != 0) return;
  for (const auto& message : messages) std::cerr << "torchpatch: warning: " << message << " (--strict makes this an error)\n";
}
}  // namespace

void apply_threads(const Args& args, int64_t fallback) {
  if (!args.has("threads") && fallback <= 0) return;
  const auto threads = int_option(args, "threads", fallback, 1);
  if (threads > 4096) throw UsageError(fmt::format("--threads: {} is more than 4096", threads));
  at::set_num_threads(static_cast<int>(threads));
}

bool shows_progress(const Args& args) {
  if (args.flag("quiet")) return false;
  const auto group = process_group();
  return !group || group->rank() == 0;
}

double progress_after(const Args& args) { return args.flag("progress") ? 0.0 : 2.0; }

namespace {
// --quantize failed: when projections of the model have input widths the 32-weight blocks do not
// divide, all of them in one message with the --keep-float patterns that keep them in float (the
// plugin names the first it meets). The model is built again in float to find them.
void refuse_unquantizable(const ModelSource& source, const PluginHost& host, const Args& args) {
  auto options = pretrained_options(args, host);
  const auto keep = options.config_overrides["quantization_config"]["modules_to_not_convert"].get<std::vector<std::string>>();
  options.config_overrides.erase("quantization_config");
  std::vector<std::string> paths;
  std::set<std::string> names;
  try {
    for (const auto& point : load_model(source, LoadModelOptions{options, false}).model->patch_points()) {
      const auto* linear = dynamic_cast<const roles::Linear*>(point.module.get());
      if (!linear || linear->in_features() % nn::kQuantBlockSize == 0) continue;
      if (unmatched_paths(keep, {{point.path, {}}}).size() < keep.size()) continue;  // kept in float already
      paths.push_back(fmt::format("{} ({})", point.path, linear->in_features()));
      names.insert(point.path.substr(point.path.rfind('.') + 1));
    }
  } catch (const std::exception&) {
    return;  // the float model fails too (or does not fit): the quantized build's own error is the one to see
  }
  if (paths.empty()) return;
  std::vector<std::string> flags;
  for (const auto& name : names) flags.push_back("--keep-float " + name);
  const bool one = paths.size() == 1;
  throw ConfigError(fmt::format("--quantize {}: {} projection{} of {} cannot be quantized, {} not being {} of 32 (the "
                                "block size): {}; keep {} in float with {}",
                                args.value("quantize"), paths.size(), one ? "" : "s",
                                printable(args.has("model") ? args.value("model") : args.value("preset")),
                                one ? "its input width" : "their input widths", one ? "a multiple" : "multiples",
                                fmt::join(paths, ", "), one ? "it" : "them", fmt::join(flags, " ")));
}
}  // namespace

BuiltModel build_model(PluginHost& host, const Args& args) {
  apply_patch_args(host, args);
  apply_threads(args);
  if (args.has("model") == args.has("preset")) throw UsageError("give exactly one of --model DIR and --preset NAME");
  ModelSource source;
  if (args.has("preset")) source.preset = args.value("preset");
  else source.checkpoint = args.value("model");
  const auto group = process_group();
  if (group && args.has("quantize")) {
    throw UsageError("--quantize: quantized projections do not split between processes yet; run without --tp");
  }
  const auto patches = parallel_patches(host);
  BuiltModel built;
  try {
    auto options = pretrained_options(args, host);
    const auto stage = fmt::format("loading {}{}", printable(args.has("model") ? args.value("model") : "preset " + args.value("preset")),
                                   args.has("quantize") ? " (quantizing to " + args.value("quantize") + ")" : "");
    StageProgress progress(stage, shows_progress(args), progress_after(args));
    options.progress = progress.callback();
    built = load_model(source, LoadModelOptions{options, args.flag("strict")});
  } catch (const ConfigError&) {
    if (args.has("quantize")) refuse_unquantizable(source, host, args);
    throw;
  }
  if (group) require_split_attention(built, host.registries());
  warn_unmatched(built, args);
  return built;
}

void agree_with_rank_zero(GenerationConfig& config) {
  if (const auto group = process_group()) config.agree_tokens = [group](at::Tensor& tokens) { group->broadcast(tokens, 0); };
}

void refuse_group(const std::string& command) {
  const auto options = dist::options_from_environment();
  if (options && options->world_size > 1) {
    throw UsageError(fmt::format("{} does not run as a group of processes yet; run it without RANK and WORLD_SIZE "
                                 "(as a group: run, generate, bench, verify, save and routing)",
                                 command));
  }
}

std::vector<OptionSpec> prompt_options() {
  return {{"prompt", "TEXT", "the prompt as text, encoded with the model's tokenizer (tokenizer.json)"},
          {"prompt-file", "FILE", "the prompt as text, read from FILE (UTF-8)"},
          {"tokenizer", "DIR", "read tokenizer.json (and tokenizer_config.json) from DIR instead of --model"}};
}

std::optional<text::Tokenizer> open_tokenizer(const Args& args) {
  if (args.has("tokenizer")) return tokenizer_of(args.value("tokenizer"));
  if (args.has("model")) return tokenizer_of(args.value("model"));
  return std::nullopt;
}

std::optional<text::Tokenizer> prompt_tokenizer(const Args& args) {
  if (!args.has("prompt") && !args.has("prompt-file")) {
    if (args.has("tokenizer")) throw UsageError("--tokenizer: only with --prompt or --prompt-file");
    return std::nullopt;
  }
  if (!args.has("tokenizer") && !args.has("model")) {
    throw UsageError("a text prompt needs a tokenizer: give --model DIR (with tokenizer.json) or --tokenizer DIR");
  }
  return open_tokenizer(args);
}

namespace {
// The text of --prompt or --prompt-file ("" when neither is given).
std::string prompt_text(const Args& args) {
  if (args.has("prompt")) return args.value("prompt");
  if (!args.has("prompt-file")) return {};
  const auto path = args.value("prompt-file");
  if (path.empty()) throw UsageError("--prompt-file: the path is empty");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError(fmt::format("--prompt-file {}: cannot open it", printable(path)));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw InputError(fmt::format("--prompt-file {}: cannot read it", printable(path)));
  return text.str();
}
}  // namespace

ModelInputs read_model_inputs(const Args& args, const text::Tokenizer* tokenizer, std::string* prompt) {
  std::vector<std::string> sources;  // the ones this command takes, for the message
  int given = 0;
  for (const char* name : {"prompt", "prompt-file", "prompt-ids", "inputs"}) {
    if (args.accepts(name)) sources.push_back(fmt::format("--{}", name));
    given += args.has(name);
  }
  if (given != 1 && sources.size() <= 1) {
    throw UsageError(sources.empty() ? std::string("this command takes no model inputs") : "give " + sources.front());
  }
  if (given != 1) {
    const auto last = sources.back();
    sources.pop_back();
    throw UsageError(fmt::format("give exactly one of {} and {}", fmt::join(sources, ", "), last));
  }
  ModelInputs in;
  if (args.has("prompt-ids")) {
    const auto ids = parse_int_list(args.value("prompt-ids"), "--prompt-ids");
    in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
    return in;
  }
  if (args.has("prompt") || args.has("prompt-file")) {
    if (tokenizer == nullptr) throw UsageError("a text prompt needs a tokenizer (--model DIR or --tokenizer DIR)");
    auto text = prompt_text(args);
    const auto ids = tokenizer->encode(text).ids;
    if (ids.empty()) throw InputError("the prompt encodes to no tokens: give some text");
    if (prompt) *prompt = std::move(text);
    in.input_ids = at::tensor(ids, at::kLong).unsqueeze(0);
    return in;
  }
  const auto file = checkpoint::SafetensorsFile::open(args.value("inputs"));
  if (!file->find("input_ids")) {
    throw InputError(fmt::format("{}: no tensor named 'input_ids' (an inputs file holds input_ids and optionally "
                                 "attention_mask, position_ids, token_type_ids)",
                                 file->path().string()));
  }
  // As stored: the model checks the dtypes (float token ids are an error, not silently truncated).
  auto read = [&](const char* name) { return file->find(name) ? file->tensor(name) : at::Tensor(); };
  in.input_ids = read("input_ids");
  in.attention_mask = read("attention_mask");
  in.position_ids = read("position_ids");
  in.token_type_ids = read("token_type_ids");
  return in;
}

void check_prompt_fits(const text::Tokenizer* tokenizer, const ModelInputs& inputs, const BuiltModel& built,
                       const Args& args) {
  if (!tokenizer || !inputs.input_ids.defined() || inputs.input_ids.numel() == 0) return;
  const int64_t vocab = built.model->config().decoder.vocab_size, largest = inputs.input_ids.max().item<int64_t>();
  if (largest < vocab) return;
  throw ConfigError(fmt::format("the prompt's token id {} is beyond {}'s vocabulary ({} ids): the tokenizer of {} ({} "
                                "ids) is not this model's; give --tokenizer the directory of the model's own "
                                "tokenizer.json",
                                largest, built.model->class_name(), vocab,
                                printable(args.has("tokenizer") ? args.value("tokenizer") : args.value("model")),
                                tokenizer->vocab_size()));
}

void print_load_report(const BuiltModel& built) {
  if (!built.report) return;
  if (!built.report->clean()) {
    std::cerr << "torchpatch: warning: " << built.report->describe(built.source) << "\n";
  } else if (!built.report->ignored.empty()) {
    std::cerr << fmt::format("torchpatch: note: {}: {} tensors of another task's head were not used ({})\n",
                             printable(built.source), built.report->ignored.size(),
                             printable(fmt::format("{}", fmt::join(built.report->ignored, ", "))));
  }
  for (const auto& [name, count] : built.report->non_finite) {
    std::cerr << fmt::format("torchpatch: warning: {}: tensor '{}' holds {} non-finite value{} (NaN or infinity; "
                             "--strict refuses such a checkpoint)\n",
                             printable(built.source), printable(name), count, count == 1 ? "" : "s");
  }
}

std::vector<std::string> counter_report(const PretrainedModel& model) {
  std::map<std::string, std::pair<int, std::map<std::string, int64_t>>> per_class;
  for (const auto& point : model.patch_points()) {
    if (!point.module->patch_record().patched()) continue;
    auto& [modules, sums] = per_class[point.module->patch_record().class_name];
    ++modules;
    for (const auto& [name, value] : point.module->counters()) sums[name] += value;
  }
  std::vector<std::string> lines;
  for (const auto& [cls, entry] : per_class) {
    std::vector<std::string> parts;
    for (const auto& [name, value] : entry.second) parts.push_back(fmt::format("{}={}", name, value));
    lines.push_back(fmt::format("{}: {}{}({} module{})", cls, fmt::join(parts, " "), parts.empty() ? "" : " ",
                                entry.first, entry.first == 1 ? "" : "s"));
  }
  return lines;
}

}  // namespace torchpatch::cli
