// Each command declares its options (OptionSpec); CLI11 parses them (a value inline or after the
// option, "--" ending the options, repeatable options, older spellings as hidden aliases); anything
// else is a usage error in our own words.
#pragma once

#include <map>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

namespace torchpatch::cli {

/// Wrong arguments: printed with the command's usage, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  std::string name;        ///< without dashes, e.g. "model": the one spelling every command uses
  std::string value_name;  ///< e.g. "DIR"; empty for a flag
  std::string help;
  bool repeatable = false;
  std::vector<std::string> aliases = {};  ///< older spellings, still accepted, not shown in help
};

class Args {
 public:
  /// Parses argv of one command; throws UsageError for unknown options, missing values, or more than
  /// `max_positional` arguments that are not options.
  Args(const std::vector<OptionSpec>& specs, const std::vector<std::string>& argv, std::size_t max_positional = 0);

  bool flag(const std::string& name) const { return values_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  /// Whether the command takes option `name` at all (it is among the specs).
  bool accepts(const std::string& name) const { return accepted_.count(name) > 0; }
  /// The value of a single-valued option ("" when absent).
  std::string value(const std::string& name) const;
  /// All values of a repeatable option.
  std::vector<std::string> values(const std::string& name) const;
  /// The arguments that are not options, in order.
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  std::set<std::string> accepted_;
};

/// The usage text of a command from its specs.
std::string usage(const std::string& command, const std::string& summary, const std::vector<OptionSpec>& specs);

/// Parses "1,2,3" into integers (UsageError naming `what` on a malformed list).
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what);

/// Option `name` as one integer at least `min` (`fallback` when absent); UsageError otherwise.
int64_t int_option(const Args& args, const std::string& name, int64_t fallback, int64_t min);
/// Option `name` as a number (`fallback` when absent); UsageError when it is not one.
double number_option(const Args& args, const std::string& name, double fallback);
/// Option `name` as a positive number of bytes (`fallback` when absent): "5000000000", "5e9", "5GB",
/// "512MB", "4GiB", "64KiB"; UsageError naming the forms otherwise.
int64_t size_option(const Args& args, const std::string& name, int64_t fallback);

}  // namespace torchpatch::cli
