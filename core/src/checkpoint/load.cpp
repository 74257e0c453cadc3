// Loading through the conversion rules, and the reverse for saving.
#include "torchpatch/checkpoint/load.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <boost/regex.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "torchpatch/printable.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/checkpoint/atomic_file.h"
#include "base/huge_pages.h"
#include "checkpoint/directory_update.h"

namespace torchpatch::checkpoint {

Loadable::~Loadable() = default;

namespace fs = std::filesystem;

std::vector<ScopedRules> model_conversion_rules(const Loadable& model, bool add_legacy,
                                               const ConversionRegistry& registry) {
  std::vector<ScopedRules> rules;
  const auto& config = model.config();
  if (auto own = registry.get(model.class_name(), config)) {
    rules.push_back({"", std::move(*own)});
  } else if (auto by_type = registry.get(config.model_type, config)) {
    rules.push_back({"", std::move(*by_type)});
  }
  // A replacement's rules follow it: they apply under every module of its class.
  for (const auto& point : model.patch_points()) {
    if (auto own = registry.get(point.module->patch_record().class_name, config)) {
      rules.push_back({point.path, std::move(*own), /*exclusive=*/true});
    }
  }
  if (add_legacy) {
    if (auto legacy = registry.get("legacy", config)) rules.push_back({"", std::move(*legacy)});
  }
  return rules;
}

namespace {

std::vector<int64_t> to_vector(at::IntArrayRef sizes) { return {sizes.begin(), sizes.end()}; }

// The tensors of one converter application, gathered from the checkpoint by source pattern.
struct Group {
  const WeightConverter* converter = nullptr;
  std::vector<std::string> target_keys;
  std::vector<std::vector<std::string>> source_keys;  // per source pattern, in natural order
  std::size_t scope = 0;                              // the plan's scope of the converter
};

// Groups keyed by their first target, in the order they were first seen.
class Groups {
 public:
  /// Adds `key` to the group of its route; returns an error text when another rule already feeds it.
  std::string add(const ConversionPlan::Route& route, const std::string& key) {
    auto [it, fresh] = groups_.try_emplace(route.key());
    if (fresh) {
      it->second = Group{route.converter, route.target_keys,
                         std::vector<std::vector<std::string>>(route.converter->sources.size()), route.scope};
      order_.push_back(route.key());
    } else if (it->second.converter != route.converter) {
      return fmt::format("'{}' is produced by two rules: {} and {} (from '{}')", route.key(),
                         describe(*it->second.converter), describe(*route.converter), key);
    }
    it->second.source_keys[route.source_index].push_back(key);
    return {};
  }
  const std::vector<std::string>& order() const { return order_; }
  const Group& at(const std::string& target) const { return groups_.at(target); }

 private:
  std::map<std::string, Group> groups_;
  std::vector<std::string> order_;
};

// Runs a group's ops; returns (full key, tensor) per output. Throws Error describing the failure.
std::vector<std::pair<std::string, at::Tensor>> run_group(const Group& group,
                                                          const std::function<at::Tensor(const std::string&)>& read) {
  const auto& conv = *group.converter;
  PatternTensors inputs;
  for (std::size_t s = 0; s < conv.sources.size(); ++s) {
    if (group.source_keys[s].empty()) {
      std::vector<std::string> found;
      for (const auto& keys : group.source_keys) found.insert(found.end(), keys.begin(), keys.end());
      throw Error(fmt::format("incomplete sources: nothing matches '{}' (found {})", conv.sources[s],
                              fmt::join(found, ", ")));
    }
    std::vector<at::Tensor> tensors;
    for (const auto& key : group.source_keys[s]) tensors.push_back(read(key));
    inputs.push_back({conv.sources[s], std::move(tensors)});
  }
  for (const auto& op : conv.operations) inputs = op->convert(std::move(inputs), conv.sources, conv.targets);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [pattern, tensors] : inputs) {
    auto it = std::find(conv.targets.begin(), conv.targets.end(), pattern);
    if (it == conv.targets.end()) throw Error(fmt::format("produced '{}', which is not a target", pattern));
    const std::string& key = group.target_keys[static_cast<std::size_t>(it - conv.targets.begin())];
    const auto star = key.find(".*.");
    if (star == std::string::npos && tensors.size() != 1) {
      throw Error(fmt::format("produced {} tensors for '{}'", tensors.size(), key));
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::string name = key;
      if (star != std::string::npos) name.replace(star, 3, fmt::format(".{}.", i));  // experts.*.w -> experts.i.w
      out.emplace_back(std::move(name), std::move(tensors[i]));
    }
  }
  return out;
}

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A converter's outputs, each on through the converters that follow it in nested scopes
// (ConversionPlan::then): inward when loading, outward when saving. `used` collects their names.
NamedTensors follow_on(const ConversionPlan& plan, NamedTensors produced, std::size_t scope, bool inward,
                       std::set<std::string>& used) {
  NamedTensors out;
  for (auto& item : produced) {
    const std::string& key = item.first;
    at::Tensor& tensor = item.second;  // a named variable: lambdas cannot capture structured bindings
    const auto next = plan.then(key, scope, inward);
    if (!next) {
      out.emplace_back(key, std::move(tensor));
      continue;
    }
    if (next->converter->sources.size() != 1) {
      throw Error(fmt::format("'{}' goes on to {}, which gathers several sources; a rule that follows another "
                              "takes its tensors one at a time",
                              key, describe(*next->converter)));
    }
    const Group single{next->converter, next->target_keys, {{key}}, next->scope};
    auto converted = run_group(single, [&](const std::string&) { return tensor; });
    used.insert(describe(*next->converter));
    for (auto& item : follow_on(plan, std::move(converted), next->scope, inward, used)) out.push_back(std::move(item));
  }
  return out;
}

// Old checkpoints store buffers that are computed, not loaded (Hugging Face ignores them): the rotary
// tables, and BERT's position and token-type id ranges.
bool computed_not_loaded(const std::string& key) {
  for (const std::string suffix : {"rotary_emb.inv_freq", "embeddings.position_ids", "embeddings.token_type_ids"}) {
    if (key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  }
  return false;
}

// Hugging Face's base_model_prefix, decided per tensor: a checkpoint key is taken as it is when it
// names a parameter, else with the prefix added (a base checkpoint in a task head) or taken off (a task
// head's checkpoint in the base model).
class BasePrefix {
 public:
  BasePrefix(const Loadable& model, const std::map<std::string, at::Tensor>& params,
             const std::vector<std::string>& ckpt_keys)
      : dot_(model.base_model_prefix().empty() ? "" : model.base_model_prefix() + "."),
        ignore_(model.ignored_checkpoint_keys()) {
    if (dot_.empty()) return;
    for (const auto& item : params) model_has_ = model_has_ || prefixed(item.first);
    for (const auto& key : ckpt_keys) ckpt_has_ = ckpt_has_ || prefixed(key);
  }

  /// The names to try for checkpoint key `key`, as it is first.
  std::vector<std::string> candidates(const std::string& key) const {
    if (dot_.empty()) return {key};
    return {key, prefixed(key) ? key.substr(dot_.size()) : dot_ + key};
  }

  /// Whether a checkpoint key that names no parameter is left out as Hugging Face does: a tensor of
  /// another task's head loading into the base model, or one the model class says to ignore.
  bool ignorable(const std::string& key) const {
    if (!dot_.empty() && !model_has_ && ckpt_has_ && !prefixed(key)) return true;
    for (const auto& name : candidates(key)) {
      for (const auto& start : ignore_) {
        if (name.compare(0, start.size(), start) == 0) return true;
      }
    }
    return false;
  }

 private:
  bool prefixed(const std::string& key) const { return key.compare(0, dot_.size(), dot_) == 0; }

  std::string dot_;  // "bert." or ""
  std::vector<std::string> ignore_;
  bool model_has_ = false, ckpt_has_ = false;
};

std::string source_name(const Checkpoint& ckpt) {
  return ckpt.files().size() == 1 ? ckpt.files().front()->path().string() : ckpt.path().string();
}

}  // namespace

std::string LoadReport::describe(const std::string& source) const {
  constexpr std::size_t kListed = 50;  // per kind: a broken checkpoint may hold 200,000 stray tensors
  std::string text = fmt::format("{}: the checkpoint does not fit the model", printable(source));
  auto list = [&](std::size_t count, const auto& line) {
    for (std::size_t i = 0; i < std::min(count, kListed); ++i) text += "\n  " + line(i);
    if (count > kListed) text += fmt::format("\n  ... and {} more", count - kListed);
  };
  const char* left = strict ? "" : " (left initialised)";
  list(missing.size(), [&](std::size_t i) { return fmt::format("missing tensor '{}'{}", printable(missing[i]), left); });
  list(unexpected.size(),
       [&](std::size_t i) { return fmt::format("unexpected tensor '{}' (no such parameter)", printable(unexpected[i])); });
  list(mismatched.size(), [&](std::size_t i) {
    const auto& m = mismatched[i];
    return fmt::format("tensor '{}' has shape [{}] but the model expects [{}]{}", printable(m.key),
                       fmt::join(m.checkpoint_shape, ", "), fmt::join(m.model_shape, ", "), left);
  });
  list(wrong_dtype.size(), [&](std::size_t i) {
    const auto& w = wrong_dtype[i];
    return fmt::format("tensor '{}' is stored as {} but the parameter is {}: not cast{}", printable(w.key),
                       w.checkpoint_dtype, w.model_dtype, left);
  });
  for (const auto& [key, error] : conversion_errors) {
    text += fmt::format("\n  conversion for '{}' failed: {}", printable(key), printable(error));
  }
  list(ignored.size(),
       [&](std::size_t i) { return fmt::format("ignored tensor '{}' (another task's head)", printable(ignored[i])); });
  return text;
}

nlohmann::json LoadReport::to_json() const {
  auto mismatches = nlohmann::json::array();
  for (const auto& m : mismatched) {
    mismatches.push_back({{"key", m.key}, {"checkpoint_shape", m.checkpoint_shape}, {"model_shape", m.model_shape}});
  }
  auto dtypes = nlohmann::json::array();
  for (const auto& w : wrong_dtype) {
    dtypes.push_back({{"key", w.key}, {"checkpoint_dtype", w.checkpoint_dtype}, {"model_dtype", w.model_dtype}});
  }
  auto non_finite_counts = nlohmann::json::object();
  for (const auto& [key, count] : non_finite) non_finite_counts[key] = count;
  return {{"missing", missing},
          {"unexpected", unexpected},
          {"mismatched", mismatches},
          {"wrong_dtype", dtypes},
          {"non_finite", non_finite_counts},
          {"conversion_errors", conversion_errors},
          {"conversions", conversions},
          {"ignored", ignored},
          {"strict", strict}};
}

namespace {

// One load, in stages: route every checkpoint key to a parameter (directly or through a converter),
// store the tensors, then account for what the checkpoint did not provide.
class WeightLoad {
 public:
  WeightLoad(Loadable& model, const Checkpoint& ckpt, const LoadOptions& options)
      : model_(model),
        ckpt_(ckpt),
        plan_(model_conversion_rules(model, /*add_legacy=*/true,
                                     options.conversions ? *options.conversions : global_conversions())) {
    for (const auto& item : model.module().named_parameters()) params_.emplace(item.key(), item.value());
    for (const auto& [alias, target] : model.tied_weights()) {
      partner_[alias] = target;
      partner_[target] = alias;
    }
    report_.strict = options.strict;
    reject_non_finite_ = options.reject_non_finite;
    copy_mapped_ = options.copy_mapped;
    progress_ = options.progress;
  }

  LoadReport run() {
    route_keys();
    at::NoGradGuard no_grad;
    if (progress_) {
      for (const auto& key : ckpt_.keys()) total_bytes_ += static_cast<int64_t>(ckpt_.info(key).end - ckpt_.info(key).begin);
    }
    load_direct();
    load_converted();
    find_missing();
    if (report_.strict && !report_.clean()) throw CheckpointError(report_.describe(source_name(ckpt_)));
    if (reject_non_finite_ && !report_.non_finite.empty()) throw CheckpointError(describe_non_finite());
    initialise_missing();
    return std::move(report_);
  }

 private:
  void route_keys() {
    const BasePrefix base(model_, params_, ckpt_.keys());
    for (const auto& ckpt_key : ckpt_.keys()) {
      std::optional<ConversionPlan::Route> found;
      for (const auto& name : base.candidates(ckpt_key)) {
        auto route = plan_.route(name);
        if (!params_.count(route.key()) && params_.count(name)) route = ConversionPlan::Route{{name}, nullptr, 0};
        if (params_.count(route.key())) {
          found = std::move(route);
          break;
        }
      }
      if (!found) {
        if (computed_not_loaded(ckpt_key)) continue;
        if (base.ignorable(ckpt_key)) {
          report_.ignored.push_back(ckpt_key);
          continue;
        }
        const auto route = plan_.route(ckpt_key);
        report_.unexpected.push_back(route.key() == ckpt_key ? ckpt_key
                                                             : fmt::format("{} (converted to '{}')", ckpt_key, route.key()));
      } else if (!found->converter) {
        direct_.emplace_back(ckpt_key, found->key());
      } else if (const std::string clash = groups_.add(*found, ckpt_key); !clash.empty()) {
        report_.conversion_errors[found->key()] = clash;
      }
    }
  }

  void store(const std::string& name, const at::Tensor& value) {
    auto it = params_.find(name);
    if (it == params_.end()) {
      report_.unexpected.push_back(name);
      return;
    }
    loaded_.insert(name);
    at::Tensor& param = it->second;
    if (value.sizes() != param.sizes()) {  // reported as mismatched, not also as missing
      report_.mismatched.push_back({name, to_vector(value.sizes()), to_vector(param.sizes())});
      return;
    }
    if (param.is_floating_point() && !value.is_floating_point()) {
      report_.wrong_dtype.push_back({name, c10::toString(value.scalar_type()), c10::toString(param.scalar_type())});
      return;
    }
    if (value.is_floating_point()) count_non_finite(name, value);
    if (value.scalar_type() == param.scalar_type() && value.device() == param.device() && value.is_contiguous() &&
        param.is_contiguous()) {
      if (copy_mapped_ && ckpt_.maps(value.data_ptr())) {
        auto own = base::empty_in_huge_pages(value.sizes(), value.options());
        param.set_data(own.copy_(value));
      } else {
        param.set_data(value);  // adopt it: a view of the memory-mapped file, or a fresh conversion result
      }
    } else {
      param.copy_(value);  // another dtype, layout or device: convert into the parameter
    }
  }

  // Whether `name` shares the tensor of a tied partner that was loaded already.
  bool partner_loaded(const std::string& name) const {
    auto other = partner_.find(name);
    return other != partner_.end() && loaded_.count(other->second);
  }

  void advance(std::size_t bytes) {
    if (!progress_) return;
    done_bytes_ += static_cast<int64_t>(bytes);
    progress_(done_bytes_, total_bytes_);
  }

  void load_direct() {
    // Tied names share one tensor: load it once (from the first of the pair the checkpoint has).
    for (const auto& [key, name] : direct_) {
      const auto value = ckpt_.tensor(key);
      if (!partner_loaded(name)) store(name, value);
      advance(value.nbytes());
    }
  }

  void load_converted() {
    std::set<std::string> used;
    for (const auto& target : groups_.order()) {
      if (report_.conversion_errors.count(target)) continue;
      const Group& group = groups_.at(target);
      try {
        auto produced = run_group(group, [&](const std::string& k) {
          auto value = ckpt_.tensor(k);
          advance(value.nbytes());
          return value;
        });
        for (const auto& [name, value] : follow_on(plan_, std::move(produced), group.scope, /*inward=*/true, used)) {
          store(name, value);
        }
        used.insert(describe(*group.converter));
      } catch (const std::exception& e) {
        std::vector<std::string> keys;
        for (const auto& list : group.source_keys) keys.insert(keys.end(), list.begin(), list.end());
        report_.conversion_errors[target] = fmt::format("{}: {} (checkpoint tensors: {})", describe(*group.converter),
                                                        e.what(), fmt::join(keys, ", "));
      }
    }
    report_.conversions.assign(used.begin(), used.end());
  }

  void find_missing() {
    const auto aliases = model_.tied_weights();
    for (const auto& [name, tensor] : params_) {
      if (loaded_.count(name) || partner_loaded(name)) continue;
      if (aliases.count(name) && params_.count(aliases.at(name))) continue;  // reported under its target's name
      report_.missing.push_back(name);
    }
    std::sort(report_.missing.begin(), report_.missing.end(), natural_key_less);
  }

  // Non-strict: what the checkpoint did not provide gets Hugging Face's initial values.
  void initialise_missing() {
    auto initialise = [&](const std::string& name) {
      const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      const bool is_norm = name.find("norm") != std::string::npos || name.find("LayerNorm") != std::string::npos;
      nn::init_parameter(params_.at(name), is_bias, is_norm && !is_bias);
    };
    for (const auto& name : report_.missing) initialise(name);
    for (const auto& m : report_.mismatched) initialise(m.key);
    for (const auto& w : report_.wrong_dtype) initialise(w.key);
  }

  // One pass for the common case (the extremes are finite); counting only when they are not.
  void count_non_finite(const std::string& name, const at::Tensor& value) {
    if (value.numel() == 0) return;
    try {
      const auto [low, high] = at::aminmax(value);
      if (std::isfinite(low.item<double>()) && std::isfinite(high.item<double>())) return;
    } catch (const c10::Error&) {  // no aminmax kernel for this dtype: count directly
    }
    if (at::isfinite(value).all().item<bool>()) return;
    report_.non_finite.emplace_back(name, value.numel() - at::isfinite(value).sum().item<int64_t>());
  }

  std::string describe_non_finite() const {
    std::string text = fmt::format("{}: tensors hold values that are not finite (NaN or infinity)",
                                   printable(source_name(ckpt_)));
    for (const auto& [name, count] : report_.non_finite) {
      text += fmt::format("\n  tensor '{}': {} non-finite value{}", printable(name), count, count == 1 ? "" : "s");
    }
    return text;
  }

  Loadable& model_;
  const Checkpoint& ckpt_;
  const ConversionPlan plan_;
  std::map<std::string, at::Tensor> params_;
  std::map<std::string, std::string> partner_;  // tied names, both ways
  LoadReport report_;
  bool reject_non_finite_ = false;
  bool copy_mapped_ = false;
  Progress progress_;
  int64_t done_bytes_ = 0, total_bytes_ = 0;
  std::vector<std::pair<std::string, std::string>> direct_;  // checkpoint key -> model key
  Groups groups_;
  std::set<std::string> loaded_;
};

}  // namespace

LoadReport load_weights(Loadable& model, const Checkpoint& ckpt, const LoadOptions& options) {
  return WeightLoad(model, ckpt, options).run();
}

namespace {

// `rules` without the ops that encode weights (their results are saved as they are); a converter
// left with nothing to do goes (its tensors keep their names).
ConversionRules without_encodings(ConversionRules rules) {
  ConversionRules kept;
  for (auto& rule : rules) {
    if (auto* conv = std::get_if<WeightConverter>(&rule)) {
      auto& ops = conv->operations;
      const bool encoded = std::any_of(ops.begin(), ops.end(), [](const OpPtr& op) { return op->encodes(); });
      ops.erase(std::remove_if(ops.begin(), ops.end(), [](const OpPtr& op) { return op->encodes(); }), ops.end());
      if (encoded && ops.empty()) continue;
    }
    kept.push_back(std::move(rule));
  }
  return kept;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> hub_state_dict(const Loadable& model, const ConversionRegistry& registry,
                                                               bool keep_encoded) {
  std::vector<ScopedRules> reversed;
  for (auto& scoped : model_conversion_rules(model, /*add_legacy=*/false, registry)) {
    ScopedRules r{scoped.prefix, {}, scoped.exclusive};
    for (const auto& rule : keep_encoded ? without_encodings(scoped.rules) : scoped.rules) {
      r.rules.push_back(reverse_transform(rule));
    }
    reversed.push_back(std::move(r));
  }
  const ConversionPlan plan(std::move(reversed));
  const auto tied = model.tied_weights();
  std::map<std::string, at::Tensor> state;
  for (const auto& item : model.module().named_parameters()) {
    if (!tied.count(item.key())) state.emplace(item.key(), item.value().detach());
  }
  std::vector<std::string> keys;  // natural order, so module lists merge as expert 0, 1, ..., 10
  for (const auto& item : state) keys.push_back(item.first);
  std::sort(keys.begin(), keys.end(), natural_key_less);

  std::vector<std::pair<std::string, at::Tensor>> out;
  Groups groups;
  for (const auto& key : keys) {
    const at::Tensor& tensor = state.at(key);
    auto route = plan.route(key);
    if (!route.converter) {
      out.emplace_back(route.key(), tensor);
      continue;
    }
    const std::string clash = groups.add(route, key);
    if (!clash.empty()) throw CheckpointError(fmt::format("saving {}: {}", model.class_name(), clash));
  }
  for (const auto& target : groups.order()) {
    const Group& group = groups.at(target);
    try {
      std::set<std::string> used;
      auto produced = run_group(group, [&](const std::string& k) { return state.at(k); });
      for (auto& item : follow_on(plan, std::move(produced), group.scope, /*inward=*/false, used)) {
        out.push_back(std::move(item));
      }
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("saving {}: {} for '{}': {}", model.class_name(), describe(*group.converter),
                                        target, e.what()));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return natural_key_less(a.first, b.first); });
  return out;
}

namespace {

// Greedy shards in key order, as Hugging Face splits them.
std::vector<std::vector<std::pair<std::string, at::Tensor>>> split_shards(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t max_shard_bytes) {
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t shard_bytes = 0;
  for (const auto& item : tensors) {
    const int64_t bytes = static_cast<int64_t>(item.second.numel() * item.second.element_size());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(item);
    shard_bytes += bytes;
  }
  return shards;
}

// Files of a checkpoint's own layout: what a save replaces (and removes where the new one lacks them).
bool checkpoint_file(const std::string& name) {
  static const boost::regex shard(R"(model-\d+-of-\d+\.safetensors)");
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
         boost::regex_match(name, shard);
}

// Writes config.json and the weights (one file, or shards and their index) into `dir`.
void write_checkpoint(const Loadable& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const fs::path& dir, const SaveOptions& options) {
  int64_t total = 0, done = 0;
  for (const auto& [key, tensor] : tensors) total += static_cast<int64_t>(tensor.nbytes());
  const auto wrote = [&](int64_t bytes) {
    done += bytes;
    if (options.progress) options.progress(done, total);
  };
  nlohmann::json config = model.config_json();
  if (options.dequantize) config.erase("quantization_config");
  if (!config.contains("architectures")) config["architectures"] = {model.class_name()};
  write_file_atomically(dir / "config.json", config.dump(2) + "\n");
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  const auto shards = split_shards(tensors, options.max_shard_bytes);
  if (shards.size() == 1) return save_safetensors(dir / "model.safetensors", shards.front(), metadata, wrote);
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total_bytes = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    save_safetensors(dir / name, shards[i], metadata, wrote);
    for (const auto& [key, tensor] : shards[i]) {
      weight_map[key] = name;
      total_bytes += static_cast<int64_t>(tensor.numel() * tensor.element_size());
    }
  }
  const nlohmann::json index{{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  write_file_atomically(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

// The shard names an existing checkpoint's index lists (they may be named otherwise than the hub's).
std::set<std::string> indexed_shards(const fs::path& dir) {
  std::set<std::string> names;
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::is_regular_file(index)) return names;
  try {
    const auto j = read_json_file(index, [](const std::string& m) { throw CheckpointError(m); });
    for (const auto& [key, shard] : j.at("weight_map").items()) {
      if (shard.is_string()) names.insert(shard.get<std::string>());
    }
  } catch (const std::exception&) {
    // A broken index: its shards are found by name only.
  }
  return names;
}

}  // namespace

const std::vector<std::string>& companion_files() {
  static const std::vector<std::string> names{"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                              "generation_config.json", "chat_template.jinja", "chat_template.json",
                                              "added_tokens.json",   "tokenizer.model",       "vocab.json",
                                              "merges.txt",          "vocab.txt"};
  return names;
}

std::string SaveReport::describe() const {
  std::vector<std::string> parts;
  for (const auto& [name, bytes] : files) {
    parts.push_back(bytes < 100000 ? name : fmt::format("{} ({:.1f} MB)", name, static_cast<double>(bytes) / 1e6));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

namespace {

// The companions `from` holds, copied into `staging` (their bytes as they are).
void copy_companions(const fs::path& from, const fs::path& staging) {
  for (const auto& name : companion_files()) {
    std::error_code ec;
    if (!fs::is_regular_file(from / name, ec)) continue;
    std::ifstream in(from / name, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    if (!in.good() && !in.eof()) throw CheckpointError(fmt::format("{}: cannot read it to copy it", (from / name).string()));
    write_file_atomically(staging / name, bytes);
  }
}

SaveReport report_of(const fs::path& staging) {
  SaveReport report;
  std::error_code ec;
  for (fs::directory_iterator it(staging, ec), end; !ec && it != end; it.increment(ec)) {
    report.files.emplace_back(it->path().filename().string(), fs::file_size(it->path(), ec));
  }
  std::sort(report.files.begin(), report.files.end());
  return report;
}

}  // namespace

SaveReport save_pretrained(const Loadable& model, const fs::path& dir, const SaveOptions& options) {
  auto tensors =
      hub_state_dict(model, options.conversions ? *options.conversions : global_conversions(), !options.dequantize);
  for (auto& item : tensors) {
    if (!item.second.is_cpu()) item.second = item.second.cpu();  // a model on a GPU is written from the host
  }
  SaveReport report;
  DirectoryUpdate update;
  update.write = [&](const fs::path& staging) {
    write_checkpoint(model, tensors, staging, options);
    if (!options.companions_from.empty()) copy_companions(options.companions_from, staging);
    for (const auto& [name, text] : options.companion_texts) write_file_atomically(staging / name, text);
    report = report_of(staging);
  };
  update.old_files = [](const fs::path& target) {
    const auto shards = indexed_shards(target);
    std::set<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (checkpoint_file(name) || shards.count(name)) names.insert(name);
    }
    return names;
  };
  update.last = {"model.safetensors.index.json", "config.json"};
  update_directory(dir, update);
  return report;
}

}  // namespace torchpatch::checkpoint
