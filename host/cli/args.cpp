#include "args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "torchpatch/printable.h"

namespace torchpatch::cli {

Args::Args(const std::vector<OptionSpec>& specs, const std::vector<std::string>& argv, std::size_t max_positional) {
  for (const auto& spec : specs) accepted_.insert(spec.name);
  bool options_ended = false;  // after "--" everything is positional (a text may start with dashes)
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--" && max_positional > 0 && !options_ended) {
      options_ended = true;
      continue;
    }
    if (options_ended || arg.rfind("--", 0) != 0) {
      if (positional_.size() >= max_positional) throw UsageError(fmt::format("unexpected argument '{}'", arg));
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = nullptr;
    for (const auto& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (!spec) throw UsageError(fmt::format("unknown option '--{}'", name));
    if (spec->value_name.empty()) {
      if (inline_value) throw UsageError(fmt::format("option '--{}' takes no value", name));
    } else if (!inline_value) {
      if (i + 1 >= argv.size()) throw UsageError(fmt::format("option '--{}' needs a value {}", name, spec->value_name));
      value = argv[++i];
    }
    if (values_.count(name) && !spec->repeatable) throw UsageError(fmt::format("option '--{}' given twice", name));
    values_[name].push_back(value);
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

}  // namespace torchpatch::cli
