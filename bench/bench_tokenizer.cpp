// Tokenizer speed: encoding MB/s of Llama-2's, Llama-3's and Qwen3's tokenizer.json on a long
// multilingual text (the reference texts of tests/data/tokenizers but those spelling special tokens, repeated
// to --mb megabytes) as one string and line by line, load time, and how encoding time grows with
// the text (a quarter, then all). With --js FILE (JSON lines {"tokenizer", "mb_per_s",
// "lines_mb_per_s"} from bench/tokenizer_js.cjs on the same text, same run: bench/tokenizer.sh) it
// prints the ratios to Hugging Face's JavaScript implementation.
//
//   usage: bench_tokenizer DATA_DIR [--mb N] [--write-text FILE] [--js FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/text/tokenizer.h"

using Clock = std::chrono::steady_clock;
using torchpatch::text::Tokenizer;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <typename F>
double best_seconds(int rounds, F body) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    body();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

// The reference texts without the ones that spell special tokens, joined by newlines and repeated
// to `bytes`; cut at a line end so that no character is split.
std::string benchmark_text(const std::string& data_dir, size_t bytes, int* texts) {
  std::string once;
  *texts = 0;
  const auto reference = read_json(data_dir + "/llama3/reference.json");
  for (const auto& c : reference.at("cases")) {
    if (c["name"].get<std::string>().rfind("special_inline", 0) == 0) continue;
    once += c["text"].get<std::string>() + "\n";
    ++*texts;
  }
  if (once.empty()) throw std::runtime_error("no reference texts in " + data_dir + "/llama3/reference.json");
  std::string text;
  while (text.size() < bytes) text += once;
  return text;
}

// A prefix of `text` of about `bytes`, ending after a newline.
std::string prefix(const std::string& text, size_t bytes) { return text.substr(0, text.find('\n', bytes) + 1); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_tokenizer DATA_DIR [--mb N] [--write-text FILE] [--js FILE]\n");
    return 2;
  }
  const std::string data_dir = argv[1];
  double mb = 1.0;
  std::string write_text, js_file;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--mb") mb = std::stod(argv[i + 1]);
    else if (option == "--write-text") write_text = argv[i + 1];
    else if (option == "--js") js_file = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_tokenizer: unknown option %s\n", option.c_str());
      return 2;
    }
  }
  int texts = 0;
  const auto text = benchmark_text(data_dir, static_cast<size_t>(mb * 1e6), &texts);
  if (!write_text.empty()) {
    std::ofstream(write_text, std::ios::binary) << text;
    return 0;
  }
  std::map<std::string, nlohmann::json> js;
  if (!js_file.empty()) {
    std::ifstream in(js_file);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) js[nlohmann::json::parse(line)["tokenizer"].get<std::string>()] = nlohmann::json::parse(line);
    }
  }
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    const auto end = text.find('\n', start) + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  const auto quarter = prefix(text, text.size() / 4);
  const double megabytes = text.size() / 1e6;
  fmt::print("text: {:.2f} MB ({} reference texts repeated, {} lines)\n", megabytes, texts, lines.size());
  fmt::print("{:<7} {:>7} {:>9} {:>9} {:>10} {:>8} | {:>8} {:>8} {:>6} {:>6}\n", "name", "load s", "MB/s",
             "lines MB/s", "tokens/s", "t(x4)", "JS MB/s", "JS lines", "x JS", "x JS");
  for (const std::string name : {"llama2", "llama3", "qwen3"}) {
    const auto dir = data_dir + "/" + name;
    const double load = best_seconds(3, [&] { Tokenizer::from_pretrained(dir); });
    const auto tokenizer = Tokenizer::from_pretrained(dir);
    size_t tokens = 0;
    const double whole = best_seconds(3, [&] { tokens = tokenizer.encode(text, false).ids.size(); });
    const double by_line = best_seconds(3, [&] {
      for (const auto& line : lines) tokenizer.encode(line, false);
    });
    const double part = best_seconds(3, [&] { tokenizer.encode(quarter, false); });
    fmt::print("{:<7} {:>7.3f} {:>9.2f} {:>9.2f} {:>10.0f} {:>8.2f}", name, load, megabytes / whole,
               megabytes / by_line, tokens / whole, whole / part);
    if (js.count(name)) {
      const double js_whole = js[name]["mb_per_s"], js_lines = js[name]["lines_mb_per_s"];
      fmt::print(" | {:>8.3f} {:>8.3f} {:>5.1f}x {:>5.1f}x\n", js_whole, js_lines, megabytes / whole / js_whole,
                 megabytes / by_line / js_lines);
    } else {
      fmt::print(" | (JS on the 40 short reference texts: {:.2f} MB/s, reference.json)\n",
                 read_json(dir + "/reference.json")["encode_mb_per_s_js"].get<double>());
    }
  }
  return 0;
}
