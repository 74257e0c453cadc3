// torchpatch plugins: what was found, loaded, refused and why.
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "commands.h"
#include "torchpatch/models/family.h"
#include "session.h"
#include "torchpatch/printable.h"

namespace torchpatch::cli {

int cmd_plugins(const std::vector<std::string>& argv) {
  auto specs = plugin_options();
  specs.insert(specs.end() - 1, {"probe", "", "try the bundled plugins in a child process too (drop-ins always are, "
                                              "unless --no-probe)"});
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("plugins", "List the plugins found: bundled ones (offered by class name), drop-ins from "
                                  "--plugin-dir and $TORCHPATCH_PLUGIN_PATH, and every refused file with its reason.",
                       specs);
    return 0;
  }
  const auto host = open_plugin_host(args, /*warn_refused=*/false);

  if (args.flag("json")) {
    auto list = nlohmann::json::array();
    for (const auto& p : host->plugins()) {
      auto classes = nlohmann::json::array();
      for (const auto& c : p.classes) classes.push_back({{"name", c.name}, {"role", c.role}, {"keys", c.keys}});
      list.push_back({{"path", p.path.string()},
                      {"name", p.name},
                      {"version", p.version},
                      {"status", p.status_name()},
                      {"mode", p.mode == PluginMode::DropIn ? "drop-in" : "bundled"},
                      {"reason", p.reason},
                      {"classes", classes},
                      {"conversions", p.conversions},
                      {"families", p.families}});
    }
    // Every family that can be built, built in or from a plugin.
    auto families = nlohmann::json::array();
    for (const auto& family : host->registries().families().all()) {
      std::vector<std::string> classes, presets;
      for (const auto& [name, factory] : family->model_classes) classes.push_back(name);
      for (const auto& [name, config] : family->presets) presets.push_back(name);
      families.push_back({{"model_type", family->model_type},
                          {"origin", family->origin.describe()},
                          {"classes", classes},
                          {"presets", presets}});
    }
    std::cout << nlohmann::json{{"plugins", list}, {"families", families}}.dump(2) << "\n";
    return 0;
  }
  if (host->plugins().empty()) std::cout << "no plugins found\n";
  for (const auto& p : host->plugins()) {
    // What a plugin says about itself is escaped: a name cannot forge lines of this listing.
    std::cout << fmt::format("{:<9} {} {}  [{}]  {}\n", p.status_name(), p.name.empty() ? "?" : printable(p.name),
                             printable(p.version), p.mode == PluginMode::DropIn ? "drop-in" : "bundled",
                             printable(p.path.string()));
    for (const auto& c : p.classes) {
      std::cout << fmt::format("          class {} (role {}){}{}\n", printable(c.name), c.role,
                               c.keys.empty() ? "" : " for ", printable(fmt::format("{}", fmt::join(c.keys, ", "))));
    }
    for (const auto& c : p.conversions) std::cout << "          weight conversion for " << printable(c) << "\n";
    for (const auto& f : p.families) {
      std::string presets;
      if (const auto family = host->registries().families().find(f); family && !family->presets.empty()) {
        std::vector<std::string> names;
        for (const auto& [name, config] : family->presets) names.push_back(name);
        presets = fmt::format(" (presets: {})", fmt::join(names, ", "));
      }
      std::cout << "          model family " << printable(f) << printable(presets) << "\n";
    }
    if (!p.reason.empty()) std::cout << "          reason: " << printable(p.reason) << "\n";
  }
  return 0;
}

}  // namespace torchpatch::cli
