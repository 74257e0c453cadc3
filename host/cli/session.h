// What every command shares: loading plugins, choosing patches, building the model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "args.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/dist/process_group.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/runtime/loader.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/text/tokenizer.h"

namespace torchpatch::cli {

/// --plugin-dir, --strict, --allow-world-writable, --json.
std::vector<OptionSpec> plugin_options();
/// --model, --preset, --patch (plus the plugin options).
std::vector<OptionSpec> model_options();

/// Loads the bundled plugins as a catalogue, then --plugin-dir and $TORCHPATCH_PLUGIN_PATH as drop-ins;
/// optionally warns on stderr about each refused plugin.
void load_plugins(PluginHost& host, const Args& args, bool warn_refused = true);

/// A command's plugin host (--strict, --allow-world-writable) with its plugins loaded as load_plugins does.
std::unique_ptr<PluginHost> open_plugin_host(const Args& args, bool warn_refused = true);

/// A model built with the patches in force, and what the patches did (runtime/loader.h).
using BuiltModel = LoadedModel;

/// Registers each --patch KEY=CLASS (a class offered by a loaded plugin) in the global registry.
void apply_patch_args(PluginHost& host, const Args& args);

/// The quantization_config --quantize FORMAT asks for (quant_method "ggml", llama.cpp's defaults),
/// with `keep_float` (--keep-float) added to modules_to_not_convert; UsageError for another format.
nlohmann::json quantization_config_for(const std::string& format, const std::vector<std::string>& keep_float);

/// How --dtype, --experts and --allow-incomplete ask a checkpoint to load, with `host`'s registries.
PretrainedOptions pretrained_options(const Args& args, const PluginHost& host);

/// Applies --patch KEY=CLASS, then builds --model DIR (with its weights) or --preset NAME (seed 0),
/// in --dtype; --allow-incomplete loads a checkpoint that does not fit and reports it.
/// In --strict mode a registered key that matched nothing is an error.
BuiltModel build_model(PluginHost& host, const Args& args);

/// The group this process belongs to when a launcher set RANK and WORLD_SIZE (> 1), joined on first
/// use; null otherwise. Models are then built tensor-parallel and only rank 0 prints.
std::shared_ptr<dist::ProcessGroup> process_group();

/// In a group: the decoder families' attention and MLP classes mapped to the tensor-parallel ones,
/// the MoE families' experts and sparse blocks to the expert-parallel ones, while the scope is open
/// (build_model opens it itself); nullopt outside a group.
std::optional<ScopedPatchMapping> parallel_patches(PluginHost& host);

/// Whether this process shows progress on stderr: not under --quiet, and rank 0 alone in a group.
bool shows_progress(const Args& args);
/// After how many seconds a stage's progress shows: 0 under --progress, else 2.
double progress_after(const Args& args);

/// --threads N (every model command): LibTorch's intra-op threads; without it `fallback` when
/// positive, else LibTorch's default.
void apply_threads(const Args& args, int64_t fallback = 0);

/// Before --tp starts its ranks: a built-in family (of --model's config.json or --preset) whose
/// attention does not split is refused here, once, as ConfigError naming the family and why. Nothing
/// is refused when --patch or --plugin-dir may give the attention another class (the ranks decide).
void refuse_unsplit_before_launch(const std::vector<std::string>& args);

/// In a group, makes generation take rank 0's tokens on every rank (a broadcast per step), so ranks
/// agree on sampled tokens whatever their random states; nothing outside a group.
void agree_with_rank_zero(GenerationConfig& config);

/// A UsageError naming `command` when a launcher set RANK and WORLD_SIZE (> 1): the commands that do
/// not run as a group say so instead of running N unsplit copies.
void refuse_group(const std::string& command);

/// --prompt TEXT, --prompt-file FILE and --tokenizer DIR (run and generate).
std::vector<OptionSpec> prompt_options();

/// The tokenizer of --tokenizer DIR, else of --model DIR; nullopt when neither is given.
std::optional<text::Tokenizer> open_tokenizer(const Args& args);

/// The tokenizer a text prompt needs (open_tokenizer), or nullopt for a prompt of ids; UsageError
/// when a text prompt has no tokenizer to read.
std::optional<text::Tokenizer> prompt_tokenizer(const Args& args);

/// --prompt-ids 1,2,3 or --prompt TEXT / --prompt-file FILE encoded with `tokenizer` (a batch of one),
/// or --inputs FILE.safetensors (input_ids and optionally attention_mask, position_ids, token_type_ids);
/// exactly one of them. `prompt`, when given, receives a text prompt as read.
ModelInputs read_model_inputs(const Args& args, const text::Tokenizer* tokenizer = nullptr,
                              std::string* prompt = nullptr);

/// Prints a loading report that is not clean (to stderr), one line per key.
void print_load_report(const BuiltModel& built);

/// A text prompt whose ids the model's vocabulary does not hold: ConfigError saying that the tokenizer
/// is not the model's and pointing at --tokenizer (nothing when the ids were given, not encoded).
void check_prompt_fits(const text::Tokenizer* tokenizer, const ModelInputs& inputs, const BuiltModel& built,
                       const Args& args);


/// Sum of each patched class's counters over its modules, e.g. "CustomLlamaAttention: calls=6 (2 modules)".
std::vector<std::string> counter_report(const PretrainedModel& model);

}  // namespace torchpatch::cli
