#include "torchpatch/runtime/gguf_model.h"

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch {

namespace fs = std::filesystem;
using checkpoint::GgufFile;
using checkpoint::GgufTensorInfo;

namespace {

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
  };

  GgufWeights(std::shared_ptr<const GgufFile> file, const std::vector<GgufTensorName>& names, int64_t heads,
              int64_t kv_heads)
      : file_(std::move(file)), heads_(heads), kv_heads_(kv_heads) {
    std::map<std::string, const GgufTensorName*> by_gguf;
    for (const auto& n : names) by_gguf.emplace(n.gguf, &n);
    for (const auto& t : file_->tensors()) {
      const auto [pattern, layer] = layer_pattern(t.name);
      const auto it = by_gguf.find(pattern);
      const std::string hub = it == by_gguf.end() ? t.name : fmt::format(fmt::runtime(it->second->hub), layer);
      checkpoint::TensorInfo info;
      info.name = hub;
      info.dtype = checkpoint::Dtype::F32;
      info.shape = t.shape();
      info.begin = t.begin;
      info.end = t.end;
      if (!entries_.emplace(hub, Entry{&t, it == by_gguf.end() ? GgufTensorTransform::kNone : it->second->transform}).second) {
        throw CheckpointError(fmt::format("{}: two tensors become '{}' (the second is '{}')", file_->path().string(),
                                          hub, printable(t.name)));
      }
      index_.emplace(hub, infos_.size());
      infos_.push_back(std::move(info));
    }
  }

  const fs::path& path() const override { return file_->path(); }
  const std::vector<checkpoint::TensorInfo>& tensors() const override { return infos_; }
  const checkpoint::TensorInfo* find(const std::string& name) const override {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &infos_[it->second];
  }
  bool maps(const void* p) const override { return file_->maps(p); }

  at::Tensor tensor(const std::string& name) const override {
    const auto it = entries_.find(name);
    if (it == entries_.end()) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path().string(), name));
    const auto& [gguf, transform] = it->second;
    auto t = file_->tensor(gguf->name);
    if (t.scalar_type() != at::kFloat) t = t.to(at::kFloat);
    switch (transform) {
      case GgufTensorTransform::kNone: return t;
      case GgufTensorTransform::kUnpermuteQ: return unpermute(t, heads_, gguf->name, path());
      case GgufTensorTransform::kUnpermuteK: return unpermute(t, kv_heads_, gguf->name, path());
    }
    return t;
  }

 private:
  // "blk.12.attn_q.weight" -> ("blk.{}.attn_q.weight", 12); other names as they are.
  static std::pair<std::string, int64_t> layer_pattern(const std::string& name) {
    constexpr std::string_view kPrefix = "blk.";
    if (name.rfind(kPrefix, 0) != 0) return {name, -1};
    size_t end = kPrefix.size();
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == kPrefix.size() || end >= name.size() || name[end] != '.' || end - kPrefix.size() > 9) return {name, -1};
    return {"blk.{}" + name.substr(end), std::stoll(name.substr(kPrefix.size(), end - kPrefix.size()))};
  }

  std::shared_ptr<const GgufFile> file_;
  int64_t heads_, kv_heads_;
  std::vector<checkpoint::TensorInfo> infos_;
  std::map<std::string, size_t> index_;
  std::map<std::string, Entry> entries_;
};

}  // namespace

GgufModel read_gguf_model(const fs::path& path, const FamilyRegistry& families) {
  GgufModel model;
  model.file = GgufFile::open(path);
  const GgufMetadata metadata(*model.file);
  const auto family = families.find_gguf(metadata.architecture());
  if (!family) {
    const auto known = families.gguf_architectures();
    throw ConfigError(fmt::format("{}: general.architecture '{}' is not one torchpatch reads from GGUF files (it "
                                  "reads: {})",
                                  path.string(), printable(metadata.architecture()), fmt::join(known, ", ")));
  }
  model.config = family->gguf->config(metadata);
  const auto heads = model.config.value("num_attention_heads", int64_t{0});
  const auto kv_heads = model.config.value("num_key_value_heads", heads);
  model.tensors = std::make_shared<GgufWeights>(model.file, family->gguf->tensors, heads, kv_heads);
  return model;
}

}  // namespace torchpatch
