// Conversion rules: their registry, reversal, and routing checkpoint keys through them.
#include "torchpatch/checkpoint/conversion.h"

#include <algorithm>
#include <mutex>

#include <boost/regex.hpp>

#include "base/regex_message.h"
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::checkpoint {

// -- registry ------------------------------------------------------------------------------------

ConversionRegistry::ConversionRegistry() {
  entries_["legacy"] = Entry{[](const Config&) {
                               return ConversionRules{WeightRenaming{"LayerNorm.gamma", "LayerNorm.weight"},
                                                      WeightRenaming{"LayerNorm.beta", "LayerNorm.bias"}};
                             },
                             Origin{}};
}

void ConversionRegistry::add(const std::string& key, ConversionFactory factory, bool overwrite, const Origin& origin) {
  if (!factory) throw Error(fmt::format("Conversion mapping for '{}': null factory", key));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it != entries_.end() && !overwrite) {
    throw Error(fmt::format("Conversion mapping for '{}' already exists (registered by {}). Pass overwrite=true to "
                            "replace it.",
                            key, it->second.origin.describe()));
  }
  entries_[key] = Entry{std::move(factory), origin};
}

void ConversionRegistry::add(const std::string& key, ConversionRules rules, bool overwrite, const Origin& origin) {
  add(key, ConversionFactory([rules](const Config&) { return rules; }), overwrite, origin);
}

void ConversionRegistry::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.erase(key) == 0) throw Error(fmt::format("Conversion mapping for '{}' is not registered", key));
}

std::optional<ConversionRules> ConversionRegistry::get(const std::string& key, const Config& config) const {
  ConversionFactory factory;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    factory = it->second.factory;
  }
  return factory(config);  // outside the lock: a factory may consult the registry
}

std::optional<Origin> ConversionRegistry::origin(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second.origin;
}

ConversionRegistry& global_conversions() {
  static ConversionRegistry registry;
  return registry;
}

void register_checkpoint_conversion_mapping(const std::string& key, ConversionFactory factory, bool overwrite,
                                            const Origin& origin) {
  global_conversions().add(key, std::move(factory), overwrite, origin);
}
void register_checkpoint_conversion_mapping(const std::string& key, ConversionRules rules, bool overwrite,
                                            const Origin& origin) {
  global_conversions().add(key, std::move(rules), overwrite, origin);
}
void unregister_checkpoint_conversion_mapping(const std::string& key) { global_conversions().remove(key); }
std::optional<ConversionRules> get_checkpoint_conversion_mapping(const std::string& key, const Config& config) {
  return global_conversions().get(key, config);
}
std::optional<Origin> conversion_mapping_origin(const std::string& key) { return global_conversions().origin(key); }

// -- reversal and description --------------------------------------------------------------------

WeightTransform reverse_transform(const WeightTransform& transform) {
  if (const auto* r = std::get_if<WeightRenaming>(&transform)) return WeightRenaming{r->target, r->source};
  const auto& c = std::get<WeightConverter>(transform);
  WeightConverter reversed{c.targets, c.sources, {}};
  for (auto it = c.operations.rbegin(); it != c.operations.rend(); ++it) reversed.operations.push_back((*it)->reverse());
  return reversed;
}

std::string describe(const WeightTransform& transform) {
  if (const auto* r = std::get_if<WeightRenaming>(&transform)) {
    return fmt::format("WeightRenaming('{}' -> '{}')", r->source, r->target);
  }
  const auto& c = std::get<WeightConverter>(transform);
  std::vector<std::string> ops;
  for (const auto& op : c.operations) ops.push_back(op->name());
  return fmt::format("WeightConverter([{}] -> [{}], {})", fmt::join(c.sources, ", "), fmt::join(c.targets, ", "),
                     fmt::join(ops, ", "));
}

bool natural_key_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::size_t ei = std::min(a.find('.', i), a.size()), ej = std::min(b.find('.', j), b.size());
    const std::string sa = a.substr(i, ei - i), sb = b.substr(j, ej - j);
    const bool da = !sa.empty() && sa.find_first_not_of("0123456789") == std::string::npos;
    const bool db = !sb.empty() && sb.find_first_not_of("0123456789") == std::string::npos;
    if (da != db) return da;  // numbers before names, as Python's (0, int) < (1, str)
    if (da && sa.size() != sb.size()) return sa.size() < sb.size();
    if (sa != sb) return sa < sb;
    i = ei + 1;
    j = ej + 1;
  }
  return a.size() - std::min(i, a.size()) < b.size() - std::min(j, b.size());
}

// -- routing -------------------------------------------------------------------------------------

namespace {

// Only the literal ".*." means "a dot, anything, a dot", and a leading "*." one leading segment; the
// rest of a pattern is a regular expression.
// Boost gives up on a pattern that backtracks without end (a std::runtime_error from deep inside);
// the user hears which pattern and which key instead.
bool search_pattern(const std::string& text, boost::smatch& m, const boost::regex& pattern) {
  try {
    return boost::regex_search(text, m, pattern);
  } catch (const std::runtime_error&) {
    throw CheckpointError(fmt::format("conversion pattern '{}' is too costly to match against '{}' (it backtracks "
                                      "without end); simplify the pattern",
                                      printable(pattern.str()), printable(text)));
  }
}

boost::regex compile_source(const std::string& pattern) {
  std::string rx;
  std::size_t i = 0;
  if (pattern.compare(0, 2, "*.") == 0) {  // one leading segment: an index under a module's own rules
    rx = "^[^.]+\\.";
    i = 2;
  }
  for (; i < pattern.size(); ++i) {
    if (pattern.compare(i, 3, ".*.") == 0) {
      rx += "\\..*\\.";
      i += 2;
    } else {
      rx += pattern[i];
    }
  }
  try {
    return boost::regex(rx, boost::regex::ECMAScript);
  } catch (const boost::regex_error& e) {
    throw Error(fmt::format("conversion pattern '{}' is not a valid regular expression: {}", pattern, regex_problem(e)));
  }
}

// A target is a key, with `\1` standing for the source's first group. Its anchors are not part of
// the key: a target pattern anchored for the reverse direction ("gate_up_proj$", so that saving does
// not also take gate_up_proj_bias) names "gate_up_proj".
std::string render_target(const std::string& target, const boost::smatch& match) {
  std::string out = target;
  if (!out.empty() && out.front() == '^') out.erase(0, 1);
  if (!out.empty() && out.back() == '$') out.pop_back();
  const auto pos = out.find("\\1");
  if (pos != std::string::npos) out.replace(pos, 2, match.size() > 1 ? match[1].str() : std::string());
  return out;
}

}  // namespace

struct ConversionPlan::Compiled {
  std::string prefix;  // "" or "model.layers.0.self_attn."
  bool exclusive = false;
  ConversionRules rules;
  std::vector<std::vector<boost::regex>> sources;  // per rule, per source pattern

  bool holds(const std::string& key) const { return key.compare(0, prefix.size(), prefix) == 0; }

  // The route through this scope's first converter whose source matches `key` (which it holds).
  std::optional<Route> first_converter(const std::string& key, std::size_t scope) const {
    const std::string rel = key.substr(prefix.size());
    for (std::size_t r = 0; r < rules.size(); ++r) {
      const auto* conv = std::get_if<WeightConverter>(&rules[r]);
      if (!conv) continue;
      for (std::size_t s = 0; s < conv->sources.size(); ++s) {
        boost::smatch m;
        if (!search_pattern(rel, m, sources[r][s])) continue;
        Route route;
        route.converter = conv;
        route.source_index = s;
        route.scope = scope;
        for (const auto& target : conv->targets) {
          std::string out = rel;
          out.replace(static_cast<std::size_t>(m[0].first - rel.begin()), static_cast<std::size_t>(m[0].length()),
                      render_target(target, m));
          route.target_keys.push_back(prefix + out);
        }
        return route;
      }
    }
    return std::nullopt;
  }
};

ConversionPlan::ConversionPlan(std::vector<ScopedRules> scoped) {
  for (auto& s : scoped) {
    auto c = std::make_unique<Compiled>();
    c->prefix = s.prefix.empty() ? "" : s.prefix + ".";
    c->exclusive = s.exclusive;
    for (auto& rule : s.rules) {
      std::vector<boost::regex> rx;
      if (const auto* r = std::get_if<WeightRenaming>(&rule)) {
        rx.push_back(compile_source(r->source));
      } else {
        const auto& conv = std::get<WeightConverter>(rule);
        if (conv.sources.empty() || conv.targets.empty()) throw Error(describe(rule) + ": needs sources and targets");
        if (conv.sources.size() > 1 && conv.targets.size() > 1) {
          throw Error(describe(rule) + ": you can only have one to many, one to one or many to one");
        }
        if (conv.operations.empty()) throw Error(describe(rule) + ": WeightConverter requires at least one operation");
        for (const auto& src : conv.sources) rx.push_back(compile_source(src));
      }
      c->sources.push_back(std::move(rx));
      c->rules.push_back(std::move(rule));
    }
    compiled_.push_back(std::move(c));
  }
}

ConversionPlan::~ConversionPlan() = default;
ConversionPlan::ConversionPlan(ConversionPlan&&) noexcept = default;
ConversionPlan& ConversionPlan::operator=(ConversionPlan&&) noexcept = default;

bool ConversionPlan::empty() const {
  for (const auto& c : compiled_) {
    if (!c->rules.empty()) return false;
  }
  return true;
}

ConversionPlan::Route ConversionPlan::route(const std::string& key) const {
  // The innermost exclusive scope holding the key shuts out the scopes around it.
  const Compiled* owner = nullptr;
  for (const auto& c : compiled_) {
    if (c->exclusive && key.compare(0, c->prefix.size(), c->prefix) == 0 &&
        (!owner || c->prefix.size() > owner->prefix.size())) {
      owner = c.get();
    }
  }
  auto shut_out = [&](const Compiled& c) { return owner && &c != owner && c.prefix.size() < owner->prefix.size(); };
  std::string current = key;
  // Renamings, chained, each within its scope.
  for (const auto& c : compiled_) {
    if (shut_out(*c) || current.compare(0, c->prefix.size(), c->prefix) != 0) continue;
    for (std::size_t r = 0; r < c->rules.size(); ++r) {
      const auto* renaming = std::get_if<WeightRenaming>(&c->rules[r]);
      if (!renaming) continue;
      std::string rel = current.substr(c->prefix.size());
      boost::smatch m;
      if (!search_pattern(rel, m, c->sources[r][0])) continue;
      rel.replace(static_cast<std::size_t>(m[0].first - rel.begin()), static_cast<std::size_t>(m[0].length()),
                  render_target(renaming->target, m));
      current = c->prefix + rel;
    }
  }
  // Then the first converter that matches.
  for (std::size_t i = 0; i < compiled_.size(); ++i) {
    const auto& c = *compiled_[i];
    if (shut_out(c) || !c.holds(current)) continue;
    if (auto found = c.first_converter(current, i)) return std::move(*found);
  }
  return Route{{current}, nullptr, 0};
}

std::optional<ConversionPlan::Route> ConversionPlan::then(const std::string& key, std::size_t scope,
                                                          bool inward) const {
  const std::size_t depth = compiled_.at(scope)->prefix.size();
  const Compiled* next = nullptr;
  std::size_t next_index = 0;
  for (std::size_t i = 0; i < compiled_.size(); ++i) {
    const auto& c = *compiled_[i];
    if (!c.exclusive || !c.holds(key) || (inward ? c.prefix.size() <= depth : c.prefix.size() >= depth)) continue;
    if (!next || (inward ? c.prefix.size() < next->prefix.size() : c.prefix.size() > next->prefix.size())) {
      next = &c;
      next_index = i;
    }
  }
  if (!next) return std::nullopt;
  return next->first_converter(key, next_index);
}

}  // namespace torchpatch::checkpoint
