#include "args.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "torchpatch/printable.h"

namespace torchpatch::cli {

namespace {

// CLI11's own words for a failed parse, turned into ours ("unknown option '--x'", ...).
[[noreturn]] void usage_error_from(const CLI::ParseError& e, const CLI::App& app) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    const auto extras = app.remaining();
    const std::string first = extras.empty() ? std::string() : extras.front();
    if (first.rfind("--", 0) == 0) throw UsageError(fmt::format("unknown option '{}'", printable(first.substr(0, first.find('=')), 100)));
    throw UsageError(fmt::format("unexpected argument '{}'", printable(first, 100)));
  }
  throw UsageError(printable(e.what(), 200));
}

// The spec `arg` ("--name" or "--alias") spells, or nullptr.
const OptionSpec* find_spec(const std::vector<OptionSpec>& specs, const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return nullptr;
  const auto name = arg.substr(2);
  for (const auto& spec : specs) {
    if (spec.name == name || std::find(spec.aliases.begin(), spec.aliases.end(), name) != spec.aliases.end()) return &spec;
  }
  return nullptr;
}

}  // namespace

Args::Args(const std::vector<OptionSpec>& specs, const std::vector<std::string>& argv, std::size_t max_positional) {
  // Options and their values are told apart from the other arguments here, as the commands define
  // them (a value may start with '-' or hold brackets and commas; after "--" everything is an
  // argument); CLI11 then parses the options, each value given inline.
  std::vector<std::string> tokens;
  std::map<std::string, std::size_t> empty;  // empty values given, by option
  bool ended = false;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string arg = argv[i] == "-h" && !ended ? "--help" : argv[i];
    if (!ended && arg == "--" && max_positional > 0) {
      ended = true;
      continue;
    }
    if (ended || arg.rfind("--", 0) != 0) {
      if (positional_.size() >= max_positional) throw UsageError(fmt::format("unexpected argument '{}'", printable(arg, 100)));
      positional_.push_back(arg);
      continue;
    }
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const auto* spec = find_spec(specs, name);
    if (!spec) throw UsageError(fmt::format("unknown option '{}'", printable(name, 100)));
    if (spec->value_name.empty()) {
      if (eq != std::string::npos) throw UsageError(fmt::format("option '{}' takes no value", name));
      tokens.push_back(name);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argv.size() && !find_spec(specs, argv[i + 1].substr(0, argv[i + 1].find('=')))) {
      value = argv[++i];
    } else {
      throw UsageError(fmt::format("option '{}' needs a value {}", name, spec->value_name));
    }
    // CLI11 would take the next argument for an empty inline value: an empty one is kept here.
    if (value.empty()) empty[spec->name] += 1;
    else tokens.push_back(name + "=" + value);
  }

  CLI::App app;
  app.set_help_flag();  // --help is a spec of its own, printed by the command
  app.allow_extras(false);
  std::map<std::string, CLI::Option*> options;
  for (const auto& spec : specs) {
    accepted_.insert(spec.name);
    std::string names = "--" + spec.name;
    for (const auto& alias : spec.aliases) names += ",--" + alias;
    auto* option = spec.value_name.empty() ? app.add_flag(names) : app.add_option(names)->expected(1);
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    options[spec.name] = option;
  }
  std::vector<std::string> reversed(tokens.rbegin(), tokens.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    usage_error_from(e, app);
  }
  for (const auto& spec : specs) {
    const auto* option = options.at(spec.name);
    const auto given = option->count() + (empty.count(spec.name) ? empty.at(spec.name) : 0);
    if (given == 0) continue;
    if (given > 1 && !spec.repeatable) throw UsageError(fmt::format("option '--{}' given twice", spec.name));
    auto& values = values_[spec.name];
    if (spec.value_name.empty()) {
      values.assign(given, "");
    } else {
      values = option->results();
      values.resize(given);  // the empty ones
    }
  }
}

std::string Args::value(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.front();
}

std::vector<std::string> Args::values(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>() : it->second;
}

std::string usage(const std::string& command, const std::string& summary, const std::vector<OptionSpec>& specs) {
  std::string text = fmt::format("usage: torchpatch {} [options]\n\n{}\n\noptions:\n", command, summary);
  for (const auto& s : specs) {
    const std::string left = s.value_name.empty() ? "--" + s.name : fmt::format("--{} {}", s.name, s.value_name);
    text += fmt::format("  {:<28} {}{}\n", left, s.help, s.repeatable ? " (repeatable)" : "");
  }
  return text;
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  std::size_t start = 0;
  if (text.empty()) throw UsageError(fmt::format("{}: empty list", what));
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) {
      throw UsageError(fmt::format("{}: '{}' is not an integer (expected a list like 1,2,3)", what, item));
    }
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

int64_t int_option(const Args& args, const std::string& name, int64_t fallback, int64_t min) {
  if (!args.has(name)) return fallback;
  const auto values = parse_int_list(args.value(name), "--" + name);
  if (values.size() != 1 || values[0] < min) {
    throw UsageError(fmt::format("--{}: expected one integer >= {}, got '{}'", name, min, args.value(name)));
  }
  return values[0];
}

double number_option(const Args& args, const std::string& name, double fallback) {
  if (!args.has(name)) return fallback;
  const auto text = args.value(name);
  // strtod, not stod: a value below the smallest normal double (1e-320) is still a number.
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || end != text.c_str() + text.size()) {
    throw UsageError(fmt::format("--{}: '{}' is not a number", name, printable(text, 100)));
  }
  if (errno == ERANGE && std::isinf(v)) {
    throw UsageError(fmt::format("--{}: {} is out of the range of a double", name, printable(text, 100)));
  }
  return v;
}

int64_t size_option(const Args& args, const std::string& name, int64_t fallback) {
  if (!args.has(name)) return fallback;
  const auto text = args.value(name);
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  std::string unit(static_cast<const char*>(end), text.c_str() + text.size());
  if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> scale{{"", 1},       {"B", 1},         {"KB", 1e3},
                                                   {"MB", 1e6},   {"GB", 1e9},      {"TB", 1e12},
                                                   {"KIB", 1024}, {"MIB", 1048576}, {"GIB", 1073741824.0}};
  const auto it = scale.find(unit);
  const double bytes = it == scale.end() ? 0 : number * it->second;
  if (end == text.c_str() || it == scale.end() || !(bytes >= 1) || bytes > 9.2e18) {
    throw UsageError(fmt::format("--{}: '{}' is not a size in bytes (e.g. 5000000000, 5e9, 5GB, 512MB, 4GiB)", name,
                                 printable(text, 100)));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace torchpatch::cli
