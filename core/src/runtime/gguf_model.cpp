#include "torchpatch/runtime/gguf_model.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/printable.h"
#include "runtime/gguf_tensor_pairs.h"

namespace torchpatch {

namespace fs = std::filesystem;
using checkpoint::GgufFile;
using checkpoint::GgufTensorInfo;

namespace {

// The rule of `names` that GGUF tensor `name` matches, with its hub name in `hub` (the layer number in
// place of {}, that number in `layer`); nullptr when none does.
const GgufTensorName* naming_rule(const std::string& name, const std::vector<GgufTensorName>& names, std::string& hub,
                                  std::string* layer_of = nullptr) {
  for (const auto& rule : names) {
    const auto brace = rule.gguf.find("{}");
    if (brace == std::string::npos) {
      if (rule.gguf != name) continue;
      hub = rule.hub;
      return &rule;
    }
    const auto head = rule.gguf.substr(0, brace), tail = rule.gguf.substr(brace + 2);
    if (name.size() <= head.size() + tail.size() || name.rfind(head, 0) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
      continue;
    }
    const auto layer = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (layer.find_first_not_of("0123456789") != std::string::npos) continue;
    hub = fmt::format(fmt::runtime(rule.hub), layer);
    if (layer_of != nullptr) *layer_of = layer;
    return &rule;
  }
  return nullptr;
}

// The rows of a q or k projection (weight [out, in] or bias [out]) back in Hugging Face's order:
// llama.cpp stores each head's rows as interleaved pairs (row 2i, 2i + 1 = HF rows i, i + d/2).
at::Tensor unpermute(const at::Tensor& t, int64_t heads, const std::string& name, const fs::path& file) {
  const int64_t rows = t.size(0);
  if (heads <= 0 || rows % (2 * heads) != 0) {
    throw CheckpointError(fmt::format("{}: tensor '{}': {} rows do not split into {} heads of row pairs", file.string(),
                                      name, rows, heads));
  }
  std::vector<int64_t> shape{heads, rows / heads / 2, 2};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return t.reshape(shape).transpose(1, 2).reshape(t.sizes()).contiguous();
}

// The GGUF file's tensors under Hugging Face's names, read on demand.
class GgufWeights final : public checkpoint::TensorSource {
 public:
  struct Entry {
    const GgufTensorInfo* gguf;
    GgufTensorTransform transform;
    int64_t expert = -1;                     // the expert of a stacked experts tensor this hub tensor is; -1: the whole tensor
    const GgufTensorInfo* second = nullptr;  // the other tensor of a joined pair (kJoin*)
    bool one_row = false;                    // a projection [1, in] the file holds as [in]
  };

  // `blocks`: the hub names served as the file's blocks (uint8 rows) rather than dequantized.
  GgufWeights(std::shared_ptr<const GgufFile> file, const std::vector<GgufTensorName>& names, int64_t heads,
              int64_t kv_heads, std::set<std::string> blocks)
      : file_(std::move(file)), heads_(heads), kv_heads_(kv_heads), blocks_(std::move(blocks)) {
    std::set<std::string> seconds;  // read with the first of their pair
    for (const auto& t : file_->tensors()) {
      std::string hub, layer;
      const auto* rule = naming_rule(t.name, names, hub, &layer);
      if (rule != nullptr && !rule->second.empty()) seconds.insert(fmt::format(fmt::runtime(rule->second), layer));
    }
    for (const auto& t : file_->tensors()) {
      if (seconds.count(t.name)) continue;
      std::string hub = t.name, layer;
      const auto* rule = naming_rule(t.name, names, hub, &layer);
      if (rule != nullptr && rule->stacks_experts()) {
        add_experts(t, hub, rule->transform);
        continue;
      }
      if (rule != nullptr && !rule->second.empty()) {
        add_joined(t, hub, fmt::format(fmt::runtime(rule->second), layer), rule->transform);
        continue;
      }
      checkpoint::TensorInfo info;
      info.name = hub;
      info.dtype = blocks_.count(hub) ? checkpoint::Dtype::U8 : checkpoint::Dtype::F32;
      info.shape = t.shape();
      // ggml drops a tensor's trailing dimensions of 1 (ggml_n_dims), so llama-quantize writes a
      // projection of one row (Qwen2-MoE's shared expert gate) as [in]; its weight is [1, in].
      const bool one_row = rule != nullptr && rule->projection && info.shape.size() == 1;
      if (one_row) info.shape.insert(info.shape.begin(), 1);
      if (blocks_.count(hub)) {
        const auto& type = checkpoint::ggml_type_info(t.type);
        info.shape.back() = info.shape.back() / type.block_size * type.type_size;
      }
      if (rule != nullptr && rule->transform == GgufTensorTransform::kTransposeStacked && info.shape.size() >= 2) {
        std::swap(info.shape[info.shape.size() - 1], info.shape[info.shape.size() - 2]);
      }
      info.begin = t.begin;
      info.end = t.end;
      add(Entry{&t, rule == nullptr ? GgufTensorTransform::kNone : rule->transform, -1, nullptr, one_row},
          std::move(info));
    }
  }

  const fs::path& path() const override { return file_->path(); }
  const std::vector<checkpoint::TensorInfo>& tensors() const override { return infos_; }
  const checkpoint::TensorInfo* find(const std::string& name) const override {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &infos_[it->second];
  }
  bool maps(const void* p) const override { return file_->maps(p); }

  /// The GGUF tensor hub tensor `name` is read from as it is (no transform, not an expert of a stack,
  /// not joined); nullptr for any other.
  const GgufTensorInfo* read_as_is(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) return nullptr;
    const auto& entry = it->second;
    const bool as_is = entry.transform == GgufTensorTransform::kNone && entry.expert < 0 && entry.second == nullptr;
    return as_is ? entry.gguf : nullptr;
  }

  at::Tensor tensor(const std::string& name) const override {
    const auto it = entries_.find(name);
    if (it == entries_.end()) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path().string(), name));
    const auto& [gguf, transform, expert, second, one_row] = it->second;
    if (second != nullptr) {
      return gguf_pairs::join(transform, file_->tensor(gguf->name).to(at::kFloat), file_->tensor(second->name).to(at::kFloat));
    }
    auto t = expert >= 0 ? expert_tensor(*gguf, expert)
                         : blocks_.count(name) ? file_->raw(gguf->name) : file_->tensor(gguf->name);
    if (!blocks_.count(name) && t.scalar_type() != at::kFloat) t = t.to(at::kFloat);
    if (one_row) t = t.unsqueeze(0);
    switch (transform) {
      case GgufTensorTransform::kNone: return t;
      case GgufTensorTransform::kUnpermuteQ: return unpermute(t, heads_, gguf->name, path());
      case GgufTensorTransform::kUnpermuteK: return unpermute(t, kv_heads_, gguf->name, path());
      case GgufTensorTransform::kUnitOffset: return t - 1;  // the file holds Gemma's 1 + w
      case GgufTensorTransform::kTransposeStacked: return t.transpose(-1, -2).contiguous();
      case GgufTensorTransform::kJoinMlaKvB:
      case GgufTensorTransform::kJoinInterleavedTransposed:
      case GgufTensorTransform::kJoinInterleaved: break;  // read above
    }
    return t;
  }

 private:
  void add(Entry entry, checkpoint::TensorInfo info) {
    if (!entries_.emplace(info.name, entry).second) {
      throw CheckpointError(fmt::format("{}: two tensors become '{}' (the second is '{}')", file_->path().string(),
                                        info.name, printable(entry.gguf->name)));
    }
    index_.emplace(info.name, infos_.size());
    infos_.push_back(std::move(info));
  }

  // A stacked experts tensor [E, ...] as E hub tensors: `hub` with each expert's number in place of
  // its `*`, each naming its own bytes (the experts are the outermost dimension). E is bounded as
  // llama.cpp bounds it, so that a hostile file cannot make a name for each of billions of experts.
  void add_experts(const GgufTensorInfo& t, const std::string& hub, GgufTensorTransform transform) {
    constexpr int64_t kMaxExperts = 1024;  // llama.cpp's LLAMA_MAX_EXPERTS
    const auto shape = t.shape();
    if (shape.size() < 2 || t.numel() == 0 || shape[0] > kMaxExperts) {
      throw CheckpointError(fmt::format("{}: tensor '{}' of shape [{}]: stacked experts are [experts, rows, ...] "
                                        "with values, at most {} experts (llama.cpp's limit)",
                                        file_->path().string(), printable(t.name), fmt::join(shape, ", "),
                                        kMaxExperts));
    }
    const auto bytes = (t.end - t.begin) / static_cast<uint64_t>(shape[0]);
    const auto star = hub.find(".*.");
    for (int64_t e = 0; e < shape[0]; ++e) {
      checkpoint::TensorInfo info;
      info.name = hub;
      info.name.replace(star, 3, fmt::format(".{}.", e));
      info.dtype = checkpoint::Dtype::F32;
      info.shape.assign(shape.begin() + 1, shape.end());
      info.begin = t.begin + static_cast<uint64_t>(e) * bytes;
      info.end = info.begin + bytes;
      add(Entry{&t, transform, e}, std::move(info));
    }
  }

  // A hub tensor made of GGUF tensors `first` and the one named `second` (gguf_pairs).
  void add_joined(const GgufTensorInfo& first, const std::string& hub, const std::string& second,
                  GgufTensorTransform transform) {
    const auto* other = file_->find(second);
    if (other == nullptr) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has no '{}' beside it: the two make one tensor, '{}'",
                                        file_->path().string(), printable(first.name), printable(second), hub));
    }
    checkpoint::TensorInfo info;
    info.name = hub;
    info.dtype = checkpoint::Dtype::F32;
    info.shape = gguf_pairs::joined_shape(transform, first.name, first.shape(), other->name, other->shape(), path());
    info.begin = first.begin;
    info.end = first.begin + (first.end - first.begin) + (other->end - other->begin);  // for progress: both tensors' bytes
    add(Entry{&first, transform, -1, other}, std::move(info));
  }

  // Expert `e` of a stacked tensor: F32 (and integer types) viewed, other types dequantized alone,
  // so that reading E experts dequantizes the tensor once, not E times.
  at::Tensor expert_tensor(const GgufTensorInfo& t, int64_t e) const {
    if (t.type == checkpoint::GgmlType::F32 || !checkpoint::ggml_type_info(t.type).floating) {
      return file_->tensor(t.name)[e];
    }
    const auto blocks = file_->raw(t.name)[e].contiguous();
    const auto shape = t.shape();
    auto out = at::empty(std::vector<int64_t>(shape.begin() + 1, shape.end()), at::kFloat);
    checkpoint::dequantize_ggml(t.type, blocks.data_ptr<uint8_t>(), out.numel(), out.data_ptr<float>());
    return out;
  }

  std::shared_ptr<const GgufFile> file_;
  int64_t heads_, kv_heads_;
  std::set<std::string> blocks_;
  std::vector<checkpoint::TensorInfo> infos_;
  std::map<std::string, size_t> index_;
  std::map<std::string, Entry> entries_;
};

}  // namespace

namespace {

// Projections whose block type a loaded quantization method multiplies stay blocks: the method's
// quantization_config goes into the config, and the names into `blocks`.
void keep_blocks(const GgufFile& file, const std::vector<GgufTensorName>& names, const FamilyRegistry& families,
                 nlohmann::json& config, std::set<std::string>& blocks) {
  std::shared_ptr<const QuantizationMethod> method;
  for (const auto& name : families.quantization_methods()) {
    const auto m = families.quantization_method(name);
    if (m && !m->ggml_types.empty()) method = m;
  }
  if (!method) return;
  std::map<std::string, std::string> module_type;  // projection module -> its type, lower case
  std::vector<std::string> in_float;
  std::map<std::string, int> counts;
  for (const auto& t : file.tensors()) {
    std::string hub;
    const auto* rule = naming_rule(t.name, names, hub);
    if (rule == nullptr || !rule->projection) continue;
    const std::string type = checkpoint::ggml_type_info(t.type).name;
    const auto module = hub.substr(0, hub.rfind('.'));
    if (std::find(method->ggml_types.begin(), method->ggml_types.end(), type) == method->ggml_types.end()) {
      in_float.push_back(module);
      continue;
    }
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    module_type[module] = lower;
    ++counts[lower];
    blocks.insert(hub);
  }
  if (blocks.empty()) return;
  const auto common = std::max_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
                        return a.second < b.second;
                      })->first;
  nlohmann::json q{{"quant_method", method->name}, {"format", common}};
  for (const auto& [module, type] : module_type) {
    if (type != common) q["module_formats"][module] = type;
  }
  if (!in_float.empty()) q["modules_to_not_convert"] = in_float;
  config["quantization_config"] = q;
}

}  // namespace

GgufModel read_gguf_model(const fs::path& path, const FamilyRegistry& families, bool dequantize) {
  GgufModel model;
  model.file = GgufFile::open(path);
  const GgufMetadata metadata(*model.file);
  const auto family = families.find_gguf(metadata);
  if (!family) {
    const auto known = families.gguf_architectures();
    throw ConfigError(fmt::format("{}: general.architecture '{}' is not one torchpatch reads from GGUF files (it "
                                  "reads: {})",
                                  path.string(), printable(metadata.architecture()), fmt::join(known, ", ")));
  }
  model.config = family->gguf->config(metadata);
  std::set<std::string> blocks;
  if (!dequantize) keep_blocks(*model.file, family->gguf->tensors, families, model.config, blocks);
  const auto heads = model.config.value("num_attention_heads", int64_t{0});
  const auto kv_heads = model.config.value("num_key_value_heads", heads);
  model.tensors = std::make_shared<GgufWeights>(model.file, family->gguf->tensors, heads, kv_heads, std::move(blocks));
  return model;
}

std::vector<std::string> decode_tied_weights_from_blocks(PretrainedModel& model, const GgufModel& gguf) {
  std::vector<std::string> done;
  const auto* weights = dynamic_cast<const GgufWeights*>(gguf.tensors.get());
  if (weights == nullptr) return done;
  const auto modules = model.named_modules();
  for (const auto& [alias, target] : model.tied_weights()) {
    const auto* info = weights->read_as_is(target);
    const auto dot = alias.rfind('.');
    if (info == nullptr || dot == std::string::npos || alias.substr(dot + 1) != "weight") continue;
    const auto format = nn::quant_format_of(info->type);
    const auto* found = modules.find(alias.substr(0, dot));
    if (!format || found == nullptr) continue;
    const auto linear = std::dynamic_pointer_cast<nn::Linear>(*found);
    if (linear && linear->decode_from_blocks(*format, gguf.file->raw(info->name))) done.push_back(alias);
  }
  return done;
}

namespace {

// What an unpermute undid: each head's rows as interleaved pairs again.
at::Tensor permute(const at::Tensor& t, int64_t heads) {
  std::vector<int64_t> shape{heads, 2, t.size(0) / heads / 2};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return t.reshape(shape).transpose(1, 2).reshape(t.sizes()).contiguous();
}

// The GGML type of a hub tensor: float dtypes as they are (1-D ones, norms and biases, as F32, which
// llama.cpp requires), blocks as the type the quantized module's class names ("Q8_0Linear").
checkpoint::GgmlType type_of(const std::string& name, const at::Tensor& t, const PretrainedModel& model,
                             at::Tensor& data) {
  using checkpoint::GgmlType;
  data = t;
  if (t.scalar_type() == at::kByte) {
    const auto module = name.substr(0, name.rfind('.'));
    for (const auto& point : model.patch_points()) {
      if (point.path != module) continue;
      const auto& cls = point.module->patch_record().class_name;
      const auto* type = checkpoint::ggml_type_named(cls.substr(0, cls.find_first_not_of("QK0123456789_")));
      if (type != nullptr) return type->type;
      throw ConfigError(fmt::format("{}: its blocks belong to {}, whose GGML type torchpatch does not know", name, cls));
    }
    throw ConfigError(fmt::format("{}: uint8 tensor of no quantized module", name));
  }
  if (t.dim() == 1 || t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) {
    data = t.to(at::kFloat).contiguous();
    return GgmlType::F32;
  }
  if (t.scalar_type() == at::kHalf) return GgmlType::F16;
  if (t.scalar_type() == at::kBFloat16) return GgmlType::BF16;
  throw ConfigError(fmt::format("{}: dtype {} has no GGML type", name, c10::toString(t.scalar_type())));
}

// `pattern` with the number after ".experts." replaced by `*` (a stacked-experts rule's hub name), the
// number in `expert`; `pattern` itself where it names no expert.
std::string expert_pattern(const std::string& pattern, std::string& expert) {
  const std::string marker = ".experts.";
  const auto at = pattern.find(marker);
  if (at == std::string::npos) return pattern;
  const auto begin = at + marker.size();
  const auto end = pattern.find('.', begin);
  if (end == std::string::npos || end == begin || end - begin > 9 ||
      pattern.find_first_not_of("0123456789", begin) != end) {
    return pattern;
  }
  expert = pattern.substr(begin, end - begin);
  return pattern.substr(0, begin) + "*" + pattern.substr(end);
}

// One stacked experts tensor being gathered: its place among the tensors written, and each expert's data.
struct ExpertStack {
  size_t slot = 0;
  std::map<int64_t, at::Tensor> experts;
};

// The experts of `stack`, numbered 0 to E - 1 and alike, as the [E, ...] tensor llama.cpp reads.
at::Tensor stacked(const std::string& gguf_name, const ExpertStack& stack) {
  std::vector<at::Tensor> experts;
  for (const auto& [e, data] : stack.experts) {
    const bool alike = experts.empty() ||
                       (data.sizes() == experts[0].sizes() && data.scalar_type() == experts[0].scalar_type());
    if (e != static_cast<int64_t>(experts.size()) || !alike) {
      throw ConfigError(fmt::format("{}: its experts are not numbered 0 to {} with one shape and dtype (expert {})",
                                    gguf_name, stack.experts.size() - 1, e));
    }
    experts.push_back(data);
  }
  return at::stack(experts);
}

}  // namespace

GgufSaveReport save_gguf_model(const PretrainedModel& model, const fs::path& file, const FamilyRegistry& families,
                               const GgufSaveOptions& options) {
  const auto config = model.config_json();
  const auto family = families.find(model.config().model_type);
  if (!family || !family->gguf || !family->gguf->metadata) {
    throw ConfigError(fmt::format("{} ({}): its family has no GGUF architecture (GGUF files are written for: {})",
                                  model.class_name(), model.config().model_type,
                                  fmt::join(families.gguf_architectures(), ", ")));
  }
  const auto& arch = *family->gguf;
  GgufSaveReport report;
  auto metadata = arch.metadata(config);
  metadata.emplace_back("general.file_type", checkpoint::GgufValue::of(uint32_t{0}));
  if (!options.gguf_from.empty()) {
    const auto source = GgufFile::open(options.gguf_from);
    for (const auto& entry : source->metadata()) {  // not a structured binding: the lambda captures the key (C++17)
      const std::string& key = entry.first;
      if (key.rfind("tokenizer.", 0) == 0 || (key.rfind("general.", 0) == 0 && key != "general.architecture" &&
                                               key != "general.alignment" && key != "general.file_type")) {
        metadata.erase(std::remove_if(metadata.begin(), metadata.end(), [&](const auto& m) { return m.first == key; }),
                       metadata.end());
        metadata.emplace_back(key, entry.second);
      }
    }
    report.tokenizer = source->find_value("tokenizer.ggml.model") ? "the GGUF file's" : "none (the GGUF file had none)";
  } else {
    // llama.cpp's name for a file without a vocabulary: it runs the weights (llama-bench, token ids)
    // but cannot read text.
    metadata.emplace_back("tokenizer.ggml.model", checkpoint::GgufValue::of(std::string("none")));
    report.tokenizer = "none: the model was not read from a GGUF file, so the file says tokenizer.ggml.model 'none' "
                       "(llama.cpp runs its weights, as llama-bench does, but cannot read text with it)";
  }
  // Hub names back to llama.cpp's, with the layer number in place of {}.
  std::map<std::string, const GgufTensorName*> by_hub;
  for (const auto& n : arch.tensors) by_hub.emplace(n.hub, &n);
  const auto heads = config.value("num_attention_heads", int64_t{0});
  const auto kv_heads = config.value("num_key_value_heads", heads);
  std::vector<checkpoint::GgufTensorToWrite> tensors;
  std::map<std::string, ExpertStack> stacks;  // by GGUF name
  for (const auto& [name, value] : checkpoint::hub_state_dict(
           model, options.conversions ? *options.conversions : checkpoint::global_conversions(), /*keep_encoded=*/true)) {
    std::string pattern = name;
    std::string layer;
    if (name.rfind("model.layers.", 0) == 0) {
      const auto end = name.find('.', 13);
      layer = name.substr(13, end - 13);
      pattern = "model.layers.{}" + name.substr(end);
    }
    std::string expert;
    auto it = by_hub.find(pattern);
    if (it == by_hub.end()) it = by_hub.find(expert_pattern(pattern, expert));
    if (it == by_hub.end()) {
      throw ConfigError(fmt::format("{}: tensor '{}' has no llama.cpp name in GGUF architecture '{}'", model.class_name(),
                                    name, arch.names.front()));
    }
    if (it->second->stacks_experts() && value.scalar_type() == at::kByte) {
      throw ConfigError(fmt::format("{}: experts held as quantized blocks are written to GGUF files only as float "
                                    "(load it with --dequantize, or without --quantize)",
                                    name));
    }
    if (!it->second->second.empty()) {  // one hub tensor, two GGUF tensors
      const auto [first, second] = gguf_pairs::split(it->second->transform, name, value, config);
      for (const auto& [pattern, half] : {std::pair{&it->second->gguf, first}, std::pair{&it->second->second, second}}) {
        tensors.push_back({fmt::format(fmt::runtime(*pattern), layer), checkpoint::GgmlType::F32, half.sizes().vec(), half});
        ++report.types["F32"];
      }
      continue;
    }
    at::Tensor data;
    const auto type = type_of(name, value.cpu(), model, data);
    if (it->second->transform == GgufTensorTransform::kUnpermuteQ) data = permute(data, heads);
    if (it->second->transform == GgufTensorTransform::kUnpermuteK) data = permute(data, kv_heads);
    if (it->second->transform == GgufTensorTransform::kUnitOffset) data = data + 1;
    if (it->second->transform == GgufTensorTransform::kTransposeStacked) {
      if (value.scalar_type() == at::kByte) {
        throw ConfigError(fmt::format("{}: experts held as quantized blocks are written to GGUF files only as float "
                                      "(load it with --dequantize, or without --quantize)",
                                      name));
      }
      data = data.transpose(-1, -2).contiguous();
    }
    auto shape = value.scalar_type() == at::kByte ? value.sizes().vec() : data.sizes().vec();
    if (type != checkpoint::GgmlType::F32 && value.scalar_type() == at::kByte) {
      const auto& info = checkpoint::ggml_type_info(type);
      shape.back() = shape.back() / info.type_size * info.block_size;
    }
    const auto gguf_name = fmt::format(fmt::runtime(it->second->gguf), layer);
    if (it->second->stacks_experts()) {  // gathered here, stacked once every tensor is read
      auto& stack = stacks[gguf_name];
      if (stack.experts.empty()) {
        stack.slot = tensors.size();
        tensors.push_back({gguf_name, type, {}, {}});
        ++report.types[checkpoint::ggml_type_info(type).name];
      }
      stack.experts.emplace(std::stoll(expert), data);
      continue;
    }
    tensors.push_back({gguf_name, type, shape, data});
    ++report.types[checkpoint::ggml_type_info(type).name];
  }
  for (const auto& [gguf_name, stack] : stacks) {
    auto& out = tensors[stack.slot];
    out.data = stacked(gguf_name, stack);
    out.shape = out.data.sizes().vec();
  }
  report.tensors = static_cast<int64_t>(tensors.size());
  checkpoint::save_gguf(file, metadata, tensors);
  return report;
}

}  // namespace torchpatch
