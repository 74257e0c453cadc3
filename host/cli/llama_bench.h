// llama-bench's figures for the run `torchpatch bench` makes, read from its JSON (`llama-bench -o json`)
// so that `bench --compare-llama-bench FILE` prints the ratios beside its own figures.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace torchpatch::cli {

/// One configuration's figures from a llama-bench JSON file: the best of its runs, as bench reports
/// its own best.
struct LlamaBenchFigures {
  std::string model;         ///< model_filename
  std::string model_type;    ///< e.g. "llama ?B Q4_0"
  std::string build_commit;  ///< llama.cpp's commit
  int64_t threads = 0;
  double prefill_tokens_per_second = 0;  ///< the pp test of bench's prompt length
  double decode_tokens_per_second = 0;   ///< the tg test of bench's decode tokens
};

/// The tests of `path` that match a bench run: prompt processing of `prompt_len` tokens (n_prompt,
/// n_gen 0) and generation of `decode_tokens` (n_gen, n_prompt 0), both at `threads`. UsageError
/// naming the file for one that cannot be read, is not llama-bench's JSON, or lacks either test
/// (with the tests it does hold, and the llama-bench command that makes the right ones).
LlamaBenchFigures read_llama_bench(const std::filesystem::path& path, int64_t threads, int64_t prompt_len,
                                   int64_t decode_tokens);

}  // namespace torchpatch::cli
