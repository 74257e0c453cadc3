// torchpatch plan: the module tree, what each patch point becomes and which rule chose it.
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "session.h"

namespace torchpatch::cli {

namespace {

// A readable class name for modules that are not patch points ("torch::nn::EmbeddingImpl" -> "Embedding").
std::string plain_name(const torch::nn::Module& module) {
  if (auto* model = dynamic_cast<const PretrainedModel*>(&module)) return model->class_name();
  std::string name = module.name();
  for (const std::string ns : {"torch::nn::", "torchpatch::nn::", "torchpatch::"}) {
    if (name.rfind(ns, 0) == 0) name = name.substr(ns.size());
  }
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& argv) {
  refuse_group("plan");
  const auto specs = model_options();
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("plan", "Build the model and show its module tree: what every patch point becomes, the rule "
                               "that chose it, and registered keys that matched nothing.",
                       specs);
    return 0;
  }
  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  const auto& model = *built.model;
  if (!args.flag("json") && !args.flag("quiet")) print_load_report(built);

  if (args.flag("json")) {
    auto points = nlohmann::json::array();
    for (const auto& p : model.patch_points()) {
      const auto& r = p.module->patch_record();
      points.push_back({{"path", p.path}, {"key", r.key}, {"class", r.class_name}, {"rule", r.rule},
                        {"origin", r.origin.describe()}, {"patched", r.patched()}, {"passed_over", r.passed_over}});
    }
    auto unmatched = nlohmann::json::array();
    for (const auto& u : built.unmatched) unmatched.push_back({{"key", u.key}, {"suggestion", u.suggestion}});
    std::cout << nlohmann::json{{"model", {{"class", model.class_name()}, {"model_type", model.config().model_type},
                                           {"source", built.source}}},
                                {"patch_points", points},
                                {"unmatched_keys", unmatched},
                                {"load_report", built.report ? built.report->to_json() : nlohmann::json()}}
                     .dump(2)
              << "\n";
    return 0;
  }

  std::cout << fmt::format("{} ({}, {})\n", model.class_name(), model.config().model_type, built.source);
  int patched = 0, total = 0;
  std::map<std::string, int> per_class;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto& path = item.key();
    const auto depth = static_cast<int>(std::count(path.begin(), path.end(), '.'));
    const std::string left = std::string(2 * (depth + 1), ' ') + path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
    auto* point = dynamic_cast<const PatchableModule*>(item.value().get());
    if (!point || !point->patch_record().built()) {
      std::cout << fmt::format("{:<36} {}\n", left, plain_name(*item.value()));
      continue;
    }
    ++total;
    const auto& r = point->patch_record();
    if (r.patched()) {
      ++patched;
      std::cout << fmt::format("{:<36} {} -> {}  [{}; {}]\n", left, r.key, r.class_name, r.rule, r.origin.describe());
    } else if (!r.passed_over.empty()) {
      std::cout << fmt::format("{:<36} {}  [kept: {}]\n", left, r.key, r.passed_over);
    } else {
      std::cout << fmt::format("{:<36} {}\n", left, r.key);
    }
    per_class[r.class_name + (r.patched() ? "" : r.passed_over.empty() ? " (built-in)" : " (built-in, kept by a path filter)")]++;
  }
  std::cout << fmt::format("\n{} of {} patch points replaced\n", patched, total);
  for (const auto& [cls, count] : per_class) std::cout << fmt::format("  {:>5}  {}\n", count, cls);
  if (built.report) {
    for (const auto& rule : built.report->conversions) std::cout << "checkpoint converted by " << rule << "\n";
  }
  for (const auto& u : built.unmatched) {
    std::cout << fmt::format("registered key '{}' matched nothing{}\n", u.key, u.suggestion.empty() ? "" : "; " + u.suggestion);
  }
  return 0;
}

}  // namespace torchpatch::cli
