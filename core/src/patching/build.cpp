#include "torchpatch/patching/build.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/patching/class_table.h"
#include "patching/scope_state.h"

namespace torchpatch {

PatchableModule::~PatchableModule() = default;

std::string Origin::describe() const {
  if (builtin()) return "builtin";
  return fmt::format("plugin {} {} ({})", plugin, version, file);
}

std::map<std::string, ModuleClass> builtin_classes() { return active_patch_tables().classes->all(); }

std::string patch_point_role(const std::string& key) { return active_patch_tables().classes->role_of(key); }

BuildContext BuildContext::child(const std::string& name, nlohmann::json child_args) const {
  return BuildContext{config, layer_idx, path.empty() ? name : path + "." + name, std::move(child_args)};
}

int64_t BuildContext::arg(const char* name, int64_t fallback) const {
  auto it = args.find(name);
  return it != args.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

bool BuildContext::flag(const char* name, bool fallback) const {
  auto it = args.find(name);
  return it != args.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

namespace {

// "BertSelfAttention" -> {"Attention", "SelfAttention", "BertSelfAttention"}
std::vector<std::string> camel_suffixes(const std::string& name) {
  std::vector<std::string> out;
  for (std::size_t i = name.size(); i-- > 0;) {
    if (std::isupper(static_cast<unsigned char>(name[i]))) out.push_back(name.substr(i));
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string suggest_narrower_pattern(const std::string& key, const std::string& wanted_role) {
  // The shortest CamelCase suffix that every key of the wanted role has and `key` lacks; failing
  // that, those keys spelled out.
  std::map<std::string, int> votes;
  std::vector<std::string> wanted;
  for (const auto& [name, cls] : builtin_classes()) {
    if (cls.role != wanted_role) continue;
    wanted.push_back(name);
    for (const auto& suffix : camel_suffixes(name)) {
      if (!ends_with(key, suffix)) votes[suffix]++;
    }
  }
  std::string best;
  int best_votes = 0;
  for (const auto& [suffix, count] : votes) {
    if (count > best_votes || (count == best_votes && suffix.size() < best.size())) {
      best = suffix;
      best_votes = count;
    }
  }
  if (!best.empty() && best_votes == static_cast<int>(wanted.size())) return ".*" + best + "$";
  if (wanted.empty()) return {};
  return fmt::format("^({})$", fmt::join(wanted, "|"));
}

namespace detail {

namespace {
thread_local const BuildContext* current_context = nullptr;

// Marks `ctx` as the module being built on this thread while its factory runs.
struct CurrentBuild {
  explicit CurrentBuild(const BuildContext& ctx) : previous(current_context) { current_context = &ctx; }
  ~CurrentBuild() { current_context = previous; }
  CurrentBuild(const CurrentBuild&) = delete;
  CurrentBuild& operator=(const CurrentBuild&) = delete;
  const BuildContext* previous;
};
}  // namespace

const Config& no_config() {
  static const Config config{};
  return config;
}

std::shared_ptr<PatchableModule> build_child_module(const std::string& key, const char* role, const std::string& name,
                                                    nlohmann::json args) {
  if (current_context) return build_module(key, role, current_context->child(name, std::move(args)));
  // Outside any build (a block made by hand): no config, the name as the path.
  return build_module(key, role, BuildContext{no_config(), -1, name, std::move(args)});
}

std::shared_ptr<PatchableModule> build_module(const std::string& key, const char* role,
                                              const BuildContext& ctx) {
  const ModuleClass* cls = nullptr;
  std::string rule = "builtin";
  auto* scope = active_patch_scope();
  const auto& table = scope ? *scope->tables.classes : builtin_class_table();
  std::optional<ModuleClass> builtin = table.find(key);
  const std::string kind = builtin ? builtin->kind : std::string();
  if (scope) {
    if (auto match = scope->mapping.find(key, ctx.path, kind)) {
      cls = &match->entry->cls;
      rule = match->rule();
      if (cls->role != role) {
        std::string hint = suggest_narrower_pattern(key, cls->role);
        throw PatchError(fmt::format(
            "patch point '{}' at {} needs role {}, but {} maps it to '{}' of role {}{}", key,
            ctx.path, role, match->exact ? "the exact key '" + key + "'" : rule, cls->name, cls->role,
            hint.empty() ? std::string("; use an exact class name as key")
                         : fmt::format("; use a narrower pattern such as '{}'", hint)));
      }
      std::lock_guard<std::mutex> lock(scope->mutex);
      scope->hits[static_cast<std::size_t>(match->entry - scope->mapping.entries().data())]++;
    }
  }
  if (!cls) {
    if (!builtin) {
      throw PatchError(fmt::format("patch point '{}' at {}: no built-in class and no replacement", key,
                                   ctx.path));
    }
    cls = &*builtin;
  }
  std::shared_ptr<PatchableModule> module;
  {
    CurrentBuild current(ctx);
    module = cls->factory(ctx);
  }
  if (!module) {
    throw PatchError(fmt::format("patch point '{}' at {}: factory of '{}' returned null", key, ctx.path,
                                 cls->name));
  }
  PatchRecord record{key, cls->name, rule, cls->origin, ctx.path, "", cls->devices};
  if (scope) record.passed_over = scope->mapping.passed_over(key, ctx.path, kind);
  module->set_patch_record(std::move(record));
  return module;
}

}  // namespace detail

BuildSubmodule::BuildSubmodule(const std::string& name)
    : context_(std::make_unique<BuildContext>(detail::current_context ? detail::current_context->child(name)
                                                                      : BuildContext{detail::no_config(), -1, name})),
      previous_(detail::current_context) {
  detail::current_context = context_.get();
}

BuildSubmodule::~BuildSubmodule() { detail::current_context = previous_; }

}  // namespace torchpatch
