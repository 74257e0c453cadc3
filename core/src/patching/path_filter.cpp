#include "torchpatch/patching/module_class.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

namespace torchpatch {

namespace {

// Glob match of the whole of `text`: '*' any run of characters, '?' one. Linear in practice: the
// last '*' is the only backtracking point.
bool glob_match(const std::string& pattern, const std::string& text) {
  std::size_t p = 0, t = 0, star = std::string::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p, ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// The whole path or a dotted suffix of it: "mlp.gate" matches "model.layers.0.mlp.gate".
bool matches_path(const std::string& pattern, const std::string& path) {
  if (glob_match(pattern, path)) return true;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    if (glob_match(pattern, path.substr(dot + 1))) return true;
  }
  return false;
}

}  // namespace

const std::string* PathFilter::first_match(const std::vector<std::string>& patterns, const std::string& path) {
  for (const auto& pattern : patterns) {
    if (matches_path(pattern, path)) return &pattern;
  }
  return nullptr;
}

bool PathFilter::admits(const std::string& path) const {
  if (!include.empty() && !first_match(include, path)) return false;
  return !first_match(exclude, path);
}

std::string PathFilter::why_not(const std::string& path) const {
  if (const auto* pattern = first_match(exclude, path)) return fmt::format("excludes it by '{}'", *pattern);
  if (!include.empty() && !first_match(include, path)) return fmt::format("applies only under [{}]", fmt::join(include, ", "));
  return "admits it";
}

std::string PathFilter::describe() const {
  std::string out;
  if (!include.empty()) out = fmt::format("include [{}]", fmt::join(include, ", "));
  if (!exclude.empty()) out += fmt::format("{}exclude [{}]", out.empty() ? "" : ", ", fmt::join(exclude, ", "));
  return out;
}

ModuleClass with_paths(ModuleClass cls, std::vector<std::string> include, std::vector<std::string> exclude) {
  cls.paths = PathFilter{std::move(include), std::move(exclude)};
  return cls;
}

ModuleClass with_kind(ModuleClass cls, std::string kind) {
  cls.kind = std::move(kind);
  return cls;
}

ModuleClass with_devices(ModuleClass cls, DeviceTypes devices) {
  cls.devices = std::move(devices);
  return cls;
}

bool runs_on(const DeviceTypes& devices, bool builtin, c10::DeviceType type) {
  if (devices.empty()) return builtin || type == c10::kCPU;
  return std::find(devices.begin(), devices.end(), type) != devices.end();
}

}  // namespace torchpatch
