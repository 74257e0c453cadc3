#include "llama_bench.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "args.h"

namespace torchpatch::cli {

namespace {

struct Test {
  int64_t threads = 0, prompt = 0, gen = 0;
  double best_tokens_per_second = 0;
  const nlohmann::json* entry = nullptr;
};

// An entry's test, or a UsageError naming the field that is missing or of the wrong type.
Test read_test(const nlohmann::json& entry, std::size_t index, const std::string& file) {
  const auto field = [&](const char* name) -> const nlohmann::json& {
    if (!entry.is_object() || !entry.contains(name)) {
      throw UsageError(fmt::format("--compare-llama-bench {}: entry {} has no '{}': not llama-bench's JSON (-o json)",
                                   file, index, name));
    }
    return entry.at(name);
  };
  const auto integer = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_number_integer()) {
      throw UsageError(fmt::format("--compare-llama-bench {}: entry {}'s '{}' is not an integer", file, index, name));
    }
    return v.get<int64_t>();
  };
  Test t{integer("n_threads"), integer("n_prompt"), integer("n_gen"), 0, &entry};
  // The best run, as bench reports its own; a file without samples gives its average.
  const auto& samples = entry.contains("samples_ts") ? entry.at("samples_ts") : nlohmann::json::array();
  for (const auto& s : samples) {
    if (s.is_number()) t.best_tokens_per_second = std::max(t.best_tokens_per_second, s.get<double>());
  }
  if (t.best_tokens_per_second <= 0) {
    const auto& avg = field("avg_ts");
    if (!avg.is_number()) throw UsageError(fmt::format("--compare-llama-bench {}: entry {}'s 'avg_ts' is not a number", file, index));
    t.best_tokens_per_second = avg.get<double>();
  }
  return t;
}

std::string describe(const Test& t) {
  return t.gen == 0 ? fmt::format("pp{} at {} thread(s)", t.prompt, t.threads)
                    : t.prompt == 0 ? fmt::format("tg{} at {} thread(s)", t.gen, t.threads)
                                    : fmt::format("pp{}+tg{} at {} thread(s)", t.prompt, t.gen, t.threads);
}

}  // namespace

LlamaBenchFigures read_llama_bench(const std::filesystem::path& path, int64_t threads, int64_t prompt_len,
                                   int64_t decode_tokens) {
  const std::string file = path.string();
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("--compare-llama-bench {}: cannot read the file", file));
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_array()) {
    throw UsageError(fmt::format("--compare-llama-bench {}: not llama-bench's JSON (an array of tests, as "
                                 "`llama-bench -o json` writes)",
                                 file));
  }
  std::vector<Test> tests;
  for (std::size_t i = 0; i < json.size(); ++i) tests.push_back(read_test(json[i], i, file));
  const auto find = [&](int64_t prompt, int64_t gen) -> const Test* {
    for (const auto& t : tests) {
      if (t.threads == threads && t.prompt == prompt && t.gen == gen) return &t;
    }
    return nullptr;
  };
  const Test* prefill = find(prompt_len, 0);
  const Test* decode = find(0, decode_tokens);
  if (prefill == nullptr || decode == nullptr) {
    std::vector<std::string> held;
    for (const auto& t : tests) held.push_back(describe(t));
    throw UsageError(fmt::format("--compare-llama-bench {}: no pp{} and tg{} at {} thread(s), which this run measures "
                                 "(the file holds: {}); make them with `llama-bench -m MODEL -t {} -p {} -n {} -o json`",
                                 file, prompt_len, decode_tokens, threads,
                                 held.empty() ? "no tests" : fmt::format("{}", fmt::join(held, ", ")), threads,
                                 prompt_len, decode_tokens));
  }
  const auto text_of = [&](const char* name) {
    const auto& e = *prefill->entry;
    return e.contains(name) && e.at(name).is_string() ? e.at(name).get<std::string>() : std::string();
  };
  return {text_of("model_filename"), text_of("model_type"), text_of("build_commit"), threads,
          prefill->best_tokens_per_second, decode->best_tokens_per_second};
}

}  // namespace torchpatch::cli
