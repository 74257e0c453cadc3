// Loading a checkpoint into a model through its conversion rules, with a report of everything that
// did not fit; and saving a model back in the hub layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/checkpoint.h"
#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/export.h"
#include "torchpatch/checkpoint/target.h"

namespace torchpatch::checkpoint {

/// What loading found, for the whole checkpoint at once.
struct TORCHPATCH_API LoadReport {
  struct Mismatch {
    std::string key;
    std::vector<int64_t> checkpoint_shape;
    std::vector<int64_t> model_shape;
  };
  std::vector<std::string> missing;                    ///< model tensors the checkpoint did not provide
  std::vector<std::string> unexpected;                 ///< checkpoint tensors the model has no place for
  std::vector<Mismatch> mismatched;                    ///< provided with the wrong shape (not loaded)
  struct WrongDtype {
    std::string key;
    std::string checkpoint_dtype;  ///< as the checkpoint stores it, e.g. "Int"
    std::string model_dtype;       ///< the parameter's, e.g. "Float"
  };
  /// Integer or boolean tensors given for floating-point parameters (not loaded: a cast would give
  /// numbers, just wrong ones).
  std::vector<WrongDtype> wrong_dtype;
  /// Loaded tensors holding NaN or infinity, with how many values are not finite. A warning, or an
  /// error with LoadOptions::reject_non_finite.
  std::vector<std::pair<std::string, int64_t>> non_finite;
  std::map<std::string, std::string> conversion_errors;  ///< target key -> what went wrong
  std::vector<std::string> conversions;                ///< rules that converted something
  /// Tensors of another task's head, left out when a head checkpoint loads into the base model
  /// (Hugging Face warns and goes on; so does loading here, strict or not).
  std::vector<std::string> ignored;
  bool strict = true;

  bool clean() const {
    return missing.empty() && unexpected.empty() && mismatched.empty() && wrong_dtype.empty() &&
           conversion_errors.empty();
  }
  /// A multi-line account naming the keys (names escaped; at most 50 per kind, then a count);
  /// `source` is the checkpoint path.
  std::string describe(const std::string& source) const;
  nlohmann::json to_json() const;
};

/// Told as a load or a save goes: the bytes of tensors done so far, of `total` in all.
using Progress = std::function<void(int64_t done, int64_t total)>;

struct TORCHPATCH_API LoadOptions {
  /// Any missing, unexpected, mismatched key or conversion error throws CheckpointError with the
  /// whole report. Non-strict: what is missing keeps its initial values and the report says so.
  bool strict = true;
  /// The conversion rules to load through (nullptr: global_conversions()).
  const ConversionRegistry* conversions = nullptr;
  /// NaN or infinity in a loaded tensor throws CheckpointError (otherwise it is reported).
  bool reject_non_finite = false;
  /// Parameters get their own memory (transparent huge pages where offered) instead of viewing the
  /// checkpoint's memory mapping. Loading takes longer and, while it runs, holds the mapped pages and
  /// the copies; decoding reads the copies faster (docs/quantization.md, "Mapped or copied weights").
  bool copy_mapped = false;
  /// Hears the checkpoint's bytes loaded (converted, quantized) so far.
  Progress progress;
};

/// The rules that apply to `model`: its class name's (else its model_type's), then the rules of each
/// patch point's class scoped to the module's path, then (`add_legacy`) the legacy renamings.
TORCHPATCH_API std::vector<ScopedRules> model_conversion_rules(
    const Loadable& model, bool add_legacy, const ConversionRegistry& registry = global_conversions());

/// Loads `checkpoint` into `model` (converting dtype to each parameter's).
TORCHPATCH_API LoadReport load_weights(Loadable& model, const Checkpoint& checkpoint,
                                       const LoadOptions& options = {});

/// The model's tensors in the hub layout: conversions reversed, tied aliases left out, natural order.
/// With `keep_encoded`, ops that encode weights (ConversionOp::encodes: quantization) are not
/// reversed, so quantized blocks are written as they are, under the hub's names.
TORCHPATCH_API std::vector<std::pair<std::string, at::Tensor>> hub_state_dict(
    const Loadable& model, const ConversionRegistry& registry = global_conversions(), bool keep_encoded = false);

struct TORCHPATCH_API SaveOptions {
  /// Tensors are split into shards of at most this many bytes (a single larger tensor gets its own).
  int64_t max_shard_bytes = int64_t{5} * 1000 * 1000 * 1000;
  /// The conversion rules reversed to write the hub layout (nullptr: global_conversions()).
  const ConversionRegistry* conversions = nullptr;
  /// Quantized weights are written back in float and `quantization_config` is left out of
  /// config.json (the hub layout a float model has). Otherwise they are written as their blocks and
  /// the config keeps its quantization_config, so the checkpoint loads back as it was.
  bool dequantize = false;
  /// The directory the model was loaded from: its companion files (kCompanionFiles that it holds)
  /// are written beside the new checkpoint, so the copy tokenizes and generates as the original
  /// does. Empty: none.
  std::filesystem::path companions_from = {};
  /// Companion files to write beside the checkpoint by name and content, over those copied from
  /// companions_from (a GGUF model's tokenizer.json, rebuilt from the file).
  std::vector<std::pair<std::string, std::string>> companion_texts = {};
  /// Hears the bytes of weights written so far.
  Progress progress = {};
};

/// The files beside the weights that a checkpoint directory carries for tokenizing and generating:
/// tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json, chat
/// templates, and the slow tokenizers' vocabularies.
TORCHPATCH_API const std::vector<std::string>& companion_files();

/// What save_pretrained wrote: each file's name and size in bytes, by name.
struct TORCHPATCH_API SaveReport {
  std::vector<std::pair<std::string, std::uintmax_t>> files;
  /// "config.json, model.safetensors (12.3 MB), tokenizer.json (2.1 MB)".
  std::string describe() const;
};

/// Writes `dir/config.json` and `dir/model.safetensors` (or shards `model-0000i-of-0000n.safetensors`
/// with `model.safetensors.index.json`). The directory is kept (its owner, group, mode, other files
/// and subdirectories; it may be a mount point, its parent need not be writable): the files are
/// written and synced in a staging directory inside it, committed, then each renamed over its old
/// namesake under an exclusive lock that readers (DirectoryHandle) respect, config.json last. Killed
/// at any moment, `dir` holds the old complete checkpoint or, once the next load or save there has
/// completed the commit, the new one; a failure before the commit (a full disk) leaves the old one as
/// it was. Files of the old layout (shards, index, single file) the new one lacks are removed; no other
/// file is touched.
TORCHPATCH_API SaveReport save_pretrained(const Loadable& model, const std::filesystem::path& dir,
                                          const SaveOptions& options = {});

}  // namespace torchpatch::checkpoint
