// torchpatch tokenize / detokenize: a checkpoint's tokenizer.json from the command line, one text
// (or one list of ids) at a time or a JSON-lines batch.
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "session.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/text/tokenizer.h"

namespace torchpatch::cli {

namespace {

std::vector<OptionSpec> text_options(const char* jsonl_help) {
  return {{"model", "DIR", "read the tokenizer from this checkpoint directory (tokenizer.json)"},
          {"tokenizer", "DIR", "read tokenizer.json (and tokenizer_config.json) from DIR"},
          {"jsonl", "FILE", jsonl_help},
          {"json", "", "print JSON"},
          {"help", "", "show this help"}};
}

text::Tokenizer command_tokenizer(const Args& args) {
  if (!args.has("model") && !args.has("tokenizer")) throw UsageError("give --model DIR or --tokenizer DIR");
  return *open_tokenizer(args);
}

// All of `path` ("-" = standard input).
std::string read_all(const std::string& path, const std::string& what) {
  if (path == "-") {
    std::ostringstream text;
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError(fmt::format("{} {}: cannot open it", what, printable(path)));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// Calls `each(json, line_number)` for each non-empty line of a JSON-lines file; a line that is not
// JSON is an InputError naming the file and line.
template <class Each>
void for_each_json_line(const std::string& path, Each&& each) {
  std::istringstream lines(read_all(path, "--jsonl"));
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("{} line {}: not JSON ({})", printable(path), number, e.what()));
    }
    try {
      each(value);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{} line {}: {}", printable(path), number, e.what()));
    }
  }
}

nlohmann::json encoding_json(const text::Encoding& e) {
  auto offsets = nlohmann::json::array();
  for (const auto& [begin, end] : e.offsets) offsets.push_back({begin, end});
  return {{"ids", e.ids}, {"tokens", e.tokens}, {"offsets", offsets}, {"special_tokens_mask", e.special_tokens_mask}};
}

// "1,2,3" or "1 2 3" as token ids.
std::vector<int64_t> parse_ids(std::string text) {
  for (auto& c : text) {
    if (c == ' ' || c == '\t' || c == '\n') c = ',';
  }
  const auto first = text.find_first_not_of(',');
  if (first == std::string::npos) return {};
  text = text.substr(first, text.find_last_not_of(',') - first + 1);
  return parse_int_list(text, "IDS");
}

std::vector<int64_t> ids_from_json(const nlohmann::json& value) {
  if (!value.is_array()) throw InputError("expected a JSON array of token ids");
  std::vector<int64_t> ids;
  for (const auto& id : value) {
    if (!id.is_number_integer()) throw InputError(fmt::format("expected a JSON array of token ids, found {}", id.dump()));
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

// JSON output of text that may hold invalid UTF-8 (a decoded stream cut mid-character): replaced.
std::string json_string(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& argv) {
  auto specs = text_options("encode each line of FILE (a JSON string) and print one JSON result per line");
  specs.insert(specs.begin() + 3, {"no-special-tokens", "", "do not add the tokens the post-processor adds (BOS, ...)"});
  const Args args(specs, argv, 1);
  if (args.flag("help")) {
    std::cout << usage("tokenize [TEXT | -]",
                       "Encode TEXT (or standard input, '-') with a Hugging Face tokenizer and print the ids "
                       "(comma-separated, as --prompt-ids takes them); --json adds tokens and byte offsets.",
                       specs);
    return 0;
  }
  if (args.positional().empty() == !args.has("jsonl")) throw UsageError("give exactly one of TEXT and --jsonl FILE");
  const auto tokenizer = command_tokenizer(args);
  const bool special = !args.flag("no-special-tokens");
  const bool json = args.flag("json");
  if (!args.has("jsonl")) {
    const auto& given = args.positional()[0];
    const auto e = tokenizer.encode(given == "-" ? read_all("-", "TEXT") : given, special);
    std::cout << (json ? encoding_json(e).dump() : fmt::format("{}", fmt::join(e.ids, ","))) << "\n";
    return 0;
  }
  for_each_json_line(args.value("jsonl"), [&](const nlohmann::json& value) {
    if (!value.is_string()) throw InputError("expected a JSON string");
    const auto e = tokenizer.encode(value.get<std::string>(), special);
    std::cout << (json ? encoding_json(e) : nlohmann::json(e.ids)).dump() << "\n";
  });
  return 0;
}

int cmd_detokenize(const std::vector<std::string>& argv) {
  auto specs = text_options("decode each line of FILE (a JSON array of ids) and print one JSON string per line");
  specs.insert(specs.begin() + 3, {"skip-special-tokens", "", "leave special tokens (BOS, EOS, ...) out of the text"});
  const Args args(specs, argv, 1);
  if (args.flag("help")) {
    std::cout << usage("detokenize [IDS]",
                       "Decode token ids (e.g. 1,2,3) with a Hugging Face tokenizer and print the text; --json "
                       "prints it as a JSON string.",
                       specs);
    return 0;
  }
  if (args.positional().empty() == !args.has("jsonl")) throw UsageError("give exactly one of IDS and --jsonl FILE");
  const auto tokenizer = command_tokenizer(args);
  const bool skip = args.flag("skip-special-tokens");
  if (!args.has("jsonl")) {
    const auto text = tokenizer.decode(parse_ids(args.positional()[0]), skip);
    std::cout << (args.flag("json") ? json_string(text) : text) << "\n";
    return 0;
  }
  for_each_json_line(args.value("jsonl"), [&](const nlohmann::json& value) {
    std::cout << json_string(tokenizer.decode(ids_from_json(value), skip)) << "\n";
  });
  return 0;
}

}  // namespace torchpatch::cli
