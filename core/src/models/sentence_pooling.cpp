#include "torchpatch/models/sentence_pooling.h"

#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/json_file.h"

namespace torchpatch {
namespace {

[[noreturn]] void fail(const std::string& message) { throw ConfigError(message); }

bool flag(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  return it != config.end() && it->is_boolean() && it->get<bool>();
}

// The Pooling module's config.json: exactly one of the modes torchpatch has.
SentencePooling::Mode pooling_mode(const std::filesystem::path& file) {
  const auto config = read_json_file(file, fail);
  if (!config.is_object()) fail(fmt::format("{}: the pooling configuration is not a JSON object", file.string()));
  for (const char* unsupported : {"pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken",
                                  "pooling_mode_mean_sqrt_len_tokens"}) {
    if (flag(config, unsupported)) {
      fail(fmt::format("{}: {} is a pooling torchpatch does not implement (it has mean, cls and max tokens)",
                       file.string(), unsupported));
    }
  }
  const bool mean = flag(config, "pooling_mode_mean_tokens"), cls = flag(config, "pooling_mode_cls_token"),
             max = flag(config, "pooling_mode_max_tokens");
  if (mean + cls + max != 1) {
    fail(fmt::format("{}: set exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token and "
                     "pooling_mode_max_tokens to true ({} are set)", file.string(), mean + cls + max));
  }
  return mean ? SentencePooling::Mode::kMean : cls ? SentencePooling::Mode::kCls : SentencePooling::Mode::kMax;
}

}  // namespace

std::optional<SentencePooling> read_sentence_pooling(const std::filesystem::path& dir) {
  const auto modules_file = dir / "modules.json";
  if (!path_exists(modules_file)) return std::nullopt;
  const auto modules = read_json_file(modules_file, fail);
  if (!modules.is_array()) fail(fmt::format("{}: expected a list of modules", modules_file.string()));
  SentencePooling pooling;
  bool pooled = false;
  for (size_t i = 0; i < modules.size(); ++i) {
    const auto& m = modules[i];
    const auto type = m.is_object() ? m.value("type", "") : "";
    const auto path = m.is_object() ? m.value("path", "") : "";
    // "sentence_transformers.models.Pooling" and its newer spelling "sentence_transformers.models.pooling.Pooling"
    const auto name = type.substr(type.rfind('.') + 1);
    if (name == "Transformer" && i == 0) continue;
    if (name == "Pooling" && !pooled) {
      if (path.empty() || path.find("..") != std::string::npos) {
        fail(fmt::format("{}: module {} (Pooling) names no folder inside the checkpoint", modules_file.string(), i));
      }
      pooling.mode = pooling_mode(dir / path / "config.json");
      pooled = true;
    } else if (name == "Normalize" && pooled) {
      pooling.normalize = true;
    } else {
      fail(fmt::format("{}: module {} is {}, which torchpatch does not run (it runs Transformer, then Pooling, then "
                       "optionally Normalize)", modules_file.string(), i, type.empty() ? "unnamed" : "'" + type + "'"));
    }
  }
  if (!pooled) fail(fmt::format("{}: no Pooling module, so a sentence has no single embedding", modules_file.string()));
  return pooling;
}

at::Tensor pool_sentences(const at::Tensor& hidden, const at::Tensor& attention_mask, const SentencePooling& pooling) {
  if (hidden.dim() != 3) throw InputError(fmt::format("pool_sentences: hidden states must be [B, T, H], not {}D", hidden.dim()));
  const auto states = hidden.to(at::kFloat);
  const auto mask = attention_mask.defined() ? attention_mask.to(at::kFloat).unsqueeze(-1)  // [B, T, 1]
                                             : at::ones({hidden.size(0), hidden.size(1), 1}, states.options());
  at::Tensor pooled;
  switch (pooling.mode) {
    case SentencePooling::Mode::kMean:  // sentence-transformers clamps the count so an empty row gives zeros
      pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1e-9);
      break;
    case SentencePooling::Mode::kCls:
      pooled = states.select(1, 0);
      break;
    case SentencePooling::Mode::kMax:  // padding may never win: its states are set far below any real value
      pooled = states.masked_fill(mask == 0, -1e9).amax(1);
      break;
  }
  // torch.nn.functional.normalize: x / max(||x||, 1e-12)
  if (pooling.normalize) pooled = pooled / pooled.norm(2, -1, true).clamp_min(1e-12);
  return pooled;
}

}  // namespace torchpatch
