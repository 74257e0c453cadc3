// Weight conversion between checkpoint layouts and model layouts: Hugging Face's WeightRenaming /
// WeightConverter with the Concatenate, Chunk, MergeModulelist, SplitModulelist and Transpose ops.
// Rules run forward on load and in reverse on save, so a patched model saves in the hub layout.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/export.h"
#include "torchpatch/config.h"
#include "torchpatch/patching/module_class.h"

namespace torchpatch::checkpoint {

/// Tensors collected per source pattern, in the order the op sees them.
using PatternTensors = std::vector<std::pair<std::string, std::vector<at::Tensor>>>;

/// One tensor operation of a WeightConverter.
class TORCHPATCH_API ConversionOp {
 public:
  virtual ~ConversionOp();
  /// "Concatenate(dim=0)", as Hugging Face prints it.
  virtual std::string name() const = 0;
  /// Maps the collected tensors to new (pattern, tensors) entries; throws on shapes it cannot handle.
  virtual PatternTensors convert(PatternTensors inputs, const std::vector<std::string>& sources,
                                 const std::vector<std::string>& targets) const = 0;
  /// The op that undoes this one (used on save).
  virtual std::shared_ptr<ConversionOp> reverse() const = 0;
  /// Whether the op stores weights in another encoding (quantization): saving keeps its result
  /// (the blocks) unless asked to decode (SaveOptions::dequantize), when its reverse runs.
  virtual bool encodes() const { return false; }
};

using OpPtr = std::shared_ptr<const ConversionOp>;

/// torch.cat of every source's tensors (sources in declared order) into the one target. `split_sizes`,
/// when given, are the sizes its reverse Chunk splits back into (and are checked on load): what makes
/// grouped-query q/k/v of different sizes round-trip.
TORCHPATCH_API OpPtr Concatenate(int64_t dim = 0, std::vector<int64_t> split_sizes = {});
/// Splits the one source into one part per target: equal parts, or `split_sizes`.
TORCHPATCH_API OpPtr Chunk(int64_t dim = 0, std::vector<int64_t> split_sizes = {});
/// torch.stack of each source's list of tensors (e.g. experts.*.gate_proj.weight) along `dim`.
TORCHPATCH_API OpPtr MergeModulelist(int64_t dim = 0);
/// Unstacks along `dim` into a list (the reverse of MergeModulelist).
TORCHPATCH_API OpPtr SplitModulelist(int64_t dim = 0);
/// transpose(dim0, dim1).contiguous().
TORCHPATCH_API OpPtr Transpose(int64_t dim0 = 0, int64_t dim1 = 1);

/// Renames keys: the first match of regular expression `source` is replaced by `target`
/// (`\1` in `target` is the first capture group).
struct TORCHPATCH_API WeightRenaming {
  std::string source;
  std::string target;
};

/// Converts tensors: keys matching any `sources` pattern are collected per target key and run through
/// `operations`. One to one, many to one or one to many. In patterns only the literal `.*.` is
/// "a dot, anything, a dot" (e.g. `experts.*.gate_proj.weight`), and a leading `*.` is one leading
/// segment (`*.gate_proj.weight` in the rules of an experts class, under its module's path); every
/// other character is a regex. A target names a key; a `^` or `$` anchoring it is left out of the key
/// (it anchors the pattern the target becomes when the rule is reversed for saving).
struct TORCHPATCH_API WeightConverter {
  std::vector<std::string> sources;
  std::vector<std::string> targets;
  std::vector<OpPtr> operations;
};

using WeightTransform = std::variant<WeightRenaming, WeightConverter>;
using ConversionRules = std::vector<WeightTransform>;
/// Rules may depend on the config (e.g. q/k/v sizes of a fused projection).
using ConversionFactory = std::function<ConversionRules(const Config&)>;

/// The reverse of a rule (targets and sources swapped, ops reversed and inverted).
TORCHPATCH_API WeightTransform reverse_transform(const WeightTransform& transform);
/// "WeightConverter([a, b] -> [c], Concatenate(dim=0))" for messages.
TORCHPATCH_API std::string describe(const WeightTransform& transform);

/// Conversion rules by key: a model type ("qwen2_moe"), a model class ("LlamaForCausalLM") or a
/// patch-point class ("FusedQKVAttention"; its rules apply under each module of that class). A new
/// registry holds the "legacy" renamings (old BERT names) that apply to every model; families add
/// their defaults under their model_type. The process-wide one is global_conversions().
class TORCHPATCH_API ConversionRegistry {
 public:
  ConversionRegistry();
  /// An existing key without `overwrite` is an error naming who registered it.
  void add(const std::string& key, ConversionFactory factory, bool overwrite = false, const Origin& origin = {});
  void add(const std::string& key, ConversionRules rules, bool overwrite = false, const Origin& origin = {});
  /// Removes `key`; an unknown key is an error.
  void remove(const std::string& key);
  /// The rules registered for `key` (built for `config`), or nullopt.
  std::optional<ConversionRules> get(const std::string& key, const Config& config) const;
  /// Who registered `key` (builtin or a plugin), or nullopt when absent.
  std::optional<Origin> origin(const std::string& key) const;

 private:
  struct Entry {
    ConversionFactory factory;
    Origin origin;
  };
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
};

/// The process-wide conversion rules (the built-in families' defaults are in it).
TORCHPATCH_API ConversionRegistry& global_conversions();

/// Python-named functions on the process-wide registry.
TORCHPATCH_API void register_checkpoint_conversion_mapping(const std::string& model_type_or_class, ConversionRules rules,
                                                           bool overwrite = false, const Origin& origin = {});
TORCHPATCH_API void register_checkpoint_conversion_mapping(const std::string& model_type_or_class,
                                                           ConversionFactory factory, bool overwrite = false,
                                                           const Origin& origin = {});
TORCHPATCH_API void unregister_checkpoint_conversion_mapping(const std::string& model_type_or_class);
TORCHPATCH_API std::optional<ConversionRules> get_checkpoint_conversion_mapping(const std::string& model_type_or_class,
                                                                                const Config& config);
TORCHPATCH_API std::optional<Origin> conversion_mapping_origin(const std::string& model_type_or_class);

/// Rules scoped to a module path: they see keys relative to `prefix` ("" for the whole model).
struct TORCHPATCH_API ScopedRules {
  std::string prefix;
  ConversionRules rules;
  /// Keys under `prefix` see only these rules, none from scopes around them: a replacement
  /// with rules of its own (even none) decides its weights' layout, e.g. per-expert weights kept
  /// as they are on the hub where the model's rules would fuse them.
  bool exclusive = false;
};

/// Natural order of dotted keys: numeric segments compare as numbers (expert 10 after expert 9).
TORCHPATCH_API bool natural_key_less(const std::string& a, const std::string& b);

}  // namespace torchpatch::checkpoint

namespace torchpatch::checkpoint {

/// Rules compiled for one model: where each checkpoint key goes. Renamings apply in order (chained),
/// then the first converter whose source matches; scoped rules only see keys under their prefix.
class TORCHPATCH_API ConversionPlan {
 public:
  explicit ConversionPlan(std::vector<ScopedRules> rules);
  ~ConversionPlan();
  ConversionPlan(ConversionPlan&&) noexcept;
  ConversionPlan& operator=(ConversionPlan&&) noexcept;

  struct Route {
    std::vector<std::string> target_keys;     ///< full key per converter target (one entry for renamings)
    const WeightConverter* converter = nullptr;  ///< null: a plain (possibly renamed) tensor
    std::size_t source_index = 0;             ///< which converter source collects this key
    std::size_t scope = 0;                    ///< the scope whose rule this is (an index into the plan)
    const std::string& key() const { return target_keys.front(); }
  };
  /// The route of checkpoint key `key`.
  Route route(const std::string& key) const;
  /// Where the tensor a converter of scope `scope` (its Route::scope) produced as `key` goes next: the
  /// first converter matching it in the nearest exclusive scope inside that one (`inward`, loading) or
  /// around it (saving), or
  /// nullopt. A module's replacement and the replacement of one of its children compose this way:
  /// FusedQKVAttention concatenates q/k/v into `qkv_proj.weight`, which the quantized Linear at
  /// `qkv_proj` then quantizes; saving, the Linear's reverse unpacks and the attention's splits.
  std::optional<Route> then(const std::string& key, std::size_t scope, bool inward) const;
  bool empty() const;

 private:
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> compiled_;
};

}  // namespace torchpatch::checkpoint
