// A model family, described once in its own file: its model_type, how its config.json is read, its
// model classes, its built-in patch points, its default weight conversions, its output recorders and
// its presets. The tables the rest of torchpatch consults (built-in classes, recorders, conversions,
// supported model types, presets) are filled from the registered families, never kept by hand.
#pragma once

#include "torchpatch/export.h"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/models/config.h"
#include "torchpatch/models/decoder_spec.h"
#include "torchpatch/models/gguf_architecture.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/patching/class_table.h"
#include "torchpatch/patching/module_class.h"
#include "torchpatch/patching/outputs.h"
#include "torchpatch/patching/registry.h"

namespace torchpatch {

/// Builds a whole model of one class from its config (the patches in force apply).
using ModelFactory = std::function<std::shared_ptr<PretrainedModel>(const ModelConfig&)>;

/// The kinds of shared block a family's patch points are (ModuleClass::kind): what a plugin offers a
/// replacement for, as a `{kind}` key, without naming any family, and how `--tp` splits a family
/// (Hugging Face's `tp_plan`: the bundled `tensor-parallel` plugin has one class per kind it splits).
namespace block_kind {
inline constexpr const char* kAttention = "attention";                   ///< grouped heads: q/k/v by head, o by input
inline constexpr const char* kQkNormAttention = "qk_norm_attention";     ///< the same, with per-head q/k RMSNorm
/// q/k RMSNorm over each whole projection (OLMo 2, OLMoE): the norm spans every head, so it does not
/// split by head (the tensor-parallel plugin has no class for it).
inline constexpr const char* kProjectionQkNormAttention = "projection_qk_norm_attention";
inline constexpr const char* kFusedQkvAttention = "fused_qkv_attention"; ///< one qkv_proj (Phi-3)
inline constexpr const char* kMlp = "mlp";                               ///< gate/up by column, down by row
inline constexpr const char* kFusedMlp = "fused_mlp";                    ///< one gate_up_proj (Phi-3)
inline constexpr const char* kExperts = "experts";                       ///< nn::FusedExperts; expert parallel
inline constexpr const char* kClampedSwigluExperts = "clamped_swiglu_experts";  ///< nn::ClampedSwigluExperts (GPT-OSS)
inline constexpr const char* kSparseBlock = "sparse_block";              ///< routed and shared experts, one reduction
inline constexpr const char* kRouter = "router";                         ///< nn::TopKRouter (softmax top-k); runs whole
inline constexpr const char* kGroupedRouter = "grouped_router";          ///< nn::GroupedTopKRouter (DeepSeek-style); runs whole
inline constexpr const char* kSoftmaxOfTopKRouter = "softmax_of_top_k_router";  ///< nn::SoftmaxOfTopKRouter (GPT-OSS); runs whole
}  // namespace block_kind

struct TORCHPATCH_API Family {
  std::string model_type;  ///< e.g. "llama"
  /// config.json -> the typed config, Hugging Face's defaults filled in; ConfigError on bad input.
  std::function<ModelConfig(const nlohmann::json& json, const std::string& source)> parse_config;
  /// Model classes by Hugging Face name, e.g. "LlamaForCausalLM".
  std::map<std::string, ModelFactory> model_classes;
  /// Built when config.json's `architectures` names no class of the family.
  std::string default_class;
  /// Built-in classes of the family's patch points (its model classes included), by key, each with
  /// its block_kind where it is one of the shared blocks (decoder_family sets them from the classes'
  /// bases). The kinds are the family's plan for `--tp` and what `{kind}` keys replace; a family whose
  /// attention has no kind does not split (`--tp` refuses it, naming it).
  std::vector<ModuleClass> patch_points;
  /// The kind of patch point `cls`, "" when it has none (or is not the family's).
  std::string kind_of(const std::string& cls) const;
  /// Default weight conversions for this model_type (none when empty).
  checkpoint::ConversionFactory conversions;
  /// Output recorders by model class, then by output name (e.g. "router_logits").
  std::map<std::string, std::map<std::string, OutputRecorder>> recorders;
  /// Built-in models with fixed shapes: name -> config.json object.
  std::vector<std::pair<std::string, nlohmann::json>> presets;
  /// A decoder family's classes (none for BERT): what a replacement of a whole block builds its
  /// parts from.
  std::optional<DecoderSpec> decoder;
  /// The options of the family's grouped-query attention (null: the shared attention_options of the
  /// decoder config): what a replacement of its attention (a split one) starts from. Gemma2 adds its
  /// query scale and soft cap.
  std::function<nn::GqaOptions(const ModelConfig&)> attention_options;
  /// How its q/k-norm attention normalises (null: per head, the config's rms_norm_eps): Gemma 3 adds
  /// Gemma's unit offset. What a replacement of that attention (a split one) starts from.
  std::function<nn::QkNormOptions(const ModelConfig&)> qk_norm_options;
  /// How llama.cpp's GGUF files of the family read (none: it reads none).
  std::optional<GgufArchitecture> gguf;
  /// Where the family came from: builtin or a plugin.
  Origin origin;
};

/// A quantization method, chosen as Hugging Face chooses a quantizer: by the `quant_method` of the
/// `quantization_config` in a model's config. A config that has one is built with the method's
/// patches on top of those in force (a key already mapped keeps its mapping), from a checkpoint or
/// for a preset alike; the conversion rules of its classes quantize float weights as they load.
struct TORCHPATCH_API QuantizationMethod {
  std::string name;  ///< the quant_method it answers to, e.g. "ggml"
  /// The patch mapping entries for `quantization_config`; ConfigError naming what is wrong in it.
  std::function<PatchMapping::Items(const nlohmann::json& quantization_config)> patches;
  Origin origin;
  /// GGML block types its classes multiply as they are stored ("Q8_0", ...): a GGUF file's
  /// projections of these types load as their blocks, under a quantization_config of this method
  /// ({"format": the most common type in lower case, "module_formats": {path: type} for the others,
  /// "modules_to_not_convert": [the projections held in float]}); empty: none.
  std::vector<std::string> ggml_types;
};

/// The families torchpatch can build, by model_type. Adding one registers its patch points, recorders
/// and conversions in the tables the registry was made with.
class TORCHPATCH_API FamilyRegistry {
 public:
  /// Families registered here fill these tables (which must outlive the registry).
  FamilyRegistry(ClassTable& classes, RecorderTable& recorders, checkpoint::ConversionRegistry& conversions)
      : classes_(classes), recorders_(recorders), conversions_(conversions) {}
  FamilyRegistry(const FamilyRegistry&) = delete;
  FamilyRegistry& operator=(const FamilyRegistry&) = delete;

  /// Registers `family`. A model_type already registered is an Error naming who holds it; a family
  /// without model_type, parser or model classes is an Error. All or nothing.
  void add(Family family);
  /// A patch point every family shares (Linear), in the class table without a family of its own;
  /// a clash is a PatchError as for a family's patch points.
  void add_shared_patch_point(const ModuleClass& cls);
  /// Adds a quantization method; a name already taken is an Error naming who holds it.
  void add_quantization_method(QuantizationMethod method);
  /// The method answering to `quant_method`, or nullptr.
  std::shared_ptr<const QuantizationMethod> quantization_method(const std::string& quant_method) const;
  /// The names of the methods there are.
  std::vector<std::string> quantization_methods() const;
  /// The family of `model_type`, or nullptr.
  std::shared_ptr<const Family> find(const std::string& model_type) const;
  /// Every family, by model_type.
  std::vector<std::shared_ptr<const Family>> all() const;
  /// Their model types ("llama", ...).
  std::vector<std::string> model_types() const;
  /// The family that reads the GGUF file of `metadata`: one naming its general.architecture whose
  /// GgufArchitecture::accepts takes the file (a "llama" file with experts is Mixtral's), or nullptr.
  std::shared_ptr<const Family> find_gguf(const GgufMetadata& metadata) const;
  /// The general.architecture values families read ("llama", ...).
  std::vector<std::string> gguf_architectures() const;

 private:
  ClassTable& classes_;
  RecorderTable& recorders_;
  checkpoint::ConversionRegistry& conversions_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const Family>> families_;
  std::map<std::string, std::shared_ptr<const QuantizationMethod>> quantization_methods_;
};

/// Adds the families built into libtorchpatch_core (llama, mistral, ..., bert) to `families`.
TORCHPATCH_API void add_builtin_families(FamilyRegistry& families);

/// The process-wide families (the built-in ones, and those plugins add), filling the process-wide
/// class, recorder and conversion tables.
TORCHPATCH_API FamilyRegistry& global_families();

/// The family of `model_type`; ConfigError "SOURCE: model_type 'X' is not supported (supported: ...)".
TORCHPATCH_API std::shared_ptr<const Family> family_of(const std::string& model_type, const std::string& source,
                                                       const FamilyRegistry& families = global_families());

/// Model types torchpatch can build ("llama", ...) with the process-wide families.
TORCHPATCH_API std::vector<std::string> supported_model_types();

}  // namespace torchpatch
