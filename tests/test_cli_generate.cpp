// torchpatch generate and bench as a user runs them.
#include "test_prelude.h"
#include "test_util.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/nn/attention.h"
#include "cli_util.h"

#include <fstream>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

using Catch::Matchers::Contains;
using namespace testutil;

TEST_CASE("cli generate on a padded batch writes the reference generated_ids", "[cli][generate][reference]") {
  const auto dir = data_dir() / "mistral_sliding_window";
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(dir / "reference.safetensors");
  const auto inputs = temp_file("batch-inputs.safetensors");
  torchpatch::checkpoint::save_safetensors(
      inputs, {{"input_ids", ref->tensor("input_ids")}, {"attention_mask", ref->tensor("attention_mask")}});
  const auto out = temp_file("generated.safetensors");
  const auto r = torchpatch_cli("generate --model " + dir.string() + " --inputs " + inputs.string() +
                                " --max-new-tokens 8 --ignore-eos --output " + out.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("prefill: 24 tokens in"));
  CHECK_THAT(r.out, Contains("decode:  14 tokens in"));
  CHECK_THAT(r.out, Contains("tokens/s"));
  const auto generated = torchpatch::checkpoint::SafetensorsFile::open(out)->tensor("generated_ids");
  CHECK(at::equal(generated, ref->tensor("generated_ids")));
  std::filesystem::remove(inputs);
  std::filesystem::remove(out);
}

TEST_CASE("cli generate --json prints each row's new ids, with a plugin patched in", "[cli][generate]") {
  const auto dir = data_dir() / "llama_basic";
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(dir / "reference.safetensors");
  const auto expected = ref->tensor("row1_generated_ids")[0].narrow(0, 8, 8).contiguous();
  const auto prompt = ref->tensor("row1_input_ids")[0].contiguous();
  const std::vector<int64_t> ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
  const auto r = torchpatch_cli("generate --model " + dir.string() + " --prompt-ids " + fmt::format("{}", fmt::join(ids, ",")) +
                                " --max-new-tokens 8 --json --patch LlamaAttention=FusedQKVAttention");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["rows"][0]["new_ids"].get<std::vector<int64_t>>() ==
        std::vector<int64_t>(expected.data_ptr<int64_t>(), expected.data_ptr<int64_t>() + 8));
  CHECK(j["decode"]["tokens_per_second"].get<double>() > 0);
}

TEST_CASE("cli generate: sampling with a seed repeats itself", "[cli][generate]") {
  const std::string args = "generate --preset tiny-qwen2 --prompt-ids 4,5,6 --max-new-tokens 6 --do-sample --seed 9 "
                           "--top-k 20 --top-p 0.9 --temperature 0.8 --json";
  const auto a = torchpatch_cli(args), b = torchpatch_cli(args);
  REQUIRE(a.code == 0);
  CHECK(nlohmann::json::parse(a.out)["rows"] == nlohmann::json::parse(b.out)["rows"]);
}

TEST_CASE("cli generate: bad arguments and bad input", "[cli][generate][errors]") {
  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases{
      {"--preset tiny-llama --prompt-ids 1,2 --max-new-tokens -1", 2, "--max-new-tokens: expected one integer >= 0"},
      {"--preset tiny-llama --prompt-ids 1,2 --temperature 0.5", 2, "--temperature needs --do-sample"},
      {"--preset tiny-llama --prompt-ids 1,2 --do-sample --top-p 2", 2, "--top-p: must be in (0, 1]"},
      {"--preset tiny-llama --prompt-ids 1,2 --do-sample --temperature hot", 2, "--temperature: 'hot' is not a number"},
      {"--preset tiny-llama --prompt-ids 1,x", 2, "--prompt-ids: 'x' is not an integer"},
      {"--preset tiny-llama --prompt-ids 1,300", 1, "token id 300 at [0, 1] is out of range for vocab_size 256"},
      {"--preset tiny-llama --prompt-ids 1,2 --max-new-tokens 400", 1, "more than the model supports (256"},
      {"--preset tiny-gpt --prompt-ids 1", 1, "unknown preset 'tiny-gpt'"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli("generate " + c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == c.code);
    CHECK_THAT(r.out, Contains(c.message));
  }
  // Token ids as floats: refused before the model is built.
  const auto floats = temp_file("float-ids.safetensors");
  torchpatch::checkpoint::save_safetensors(floats, {{"input_ids", at::ones({1, 3})},
                                                    {"attention_mask", at::ones({1, 3}, at::kLong)}});
  const auto r = torchpatch_cli("generate --preset llama-125m --inputs " + floats.string());
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("input_ids: expected an integer tensor, got Float"));
  CHECK_THAT(r.out, !Contains("LlamaForCausalLM"));
  std::filesystem::remove(floats);
}

TEST_CASE("cli bench prints both ratios", "[cli][bench]") {
  const auto r = torchpatch_cli("bench --preset tiny-llama --prompt-len 16 --decode-tokens 4 --repeats 1 --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["copy_bandwidth_bytes_per_second"].get<double>() > 0);
  CHECK(j["matmul_flops_per_second"].get<double>() > 0);
  // built-in, built-in on the system BLAS, with eager prefill attention (where the fused one is the
  // default), FusedQKVAttention, quantized q8_0 and q4_0
  std::vector<std::string> variants{"built-in", "built-in, system BLAS"};
  if (torchpatch::nn::prefill_attention() == torchpatch::nn::PrefillAttention::kFused) variants.push_back("built-in, eager attention");
  variants.insert(variants.end(), {"FusedQKVAttention", "quantized q8_0", "quantized q4_0"});
  REQUIRE(j["results"].size() == variants.size());
  for (size_t i = 0; i < variants.size(); ++i) CHECK(j["results"][i]["variant"] == variants[i]);
  // Quantized weights are fewer bytes per token: 34 and 18 bytes a block of 32 (lm_head at q8_0 in q4_0).
  const auto bytes = [&](size_t from_end) {
    return j["results"][variants.size() - from_end]["weight_bytes_per_token"].get<double>();
  };
  const double f32 = j["results"][0]["weight_bytes_per_token"].get<double>();
  CHECK(bytes(2) < 0.3 * f32);
  CHECK(bytes(1) < bytes(2));
  for (const auto& row : j["results"]) {
    CHECK(row["decode_fraction_of_bandwidth_limit"].get<double>() > 0);
    CHECK(row["prefill_fraction_of_matmul_rate"].get<double>() > 0);
  }
  // It says which quantized kernel ran, in which layout.
  const bool avx512 = torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx512);
  CHECK(j["quant_kernel"] == (avx512 ? "avx512" : torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx2) ? "avx2" : "scalar"));
  const bool vector = avx512 || torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx2);
  CHECK(j["quant_layout"] == (vector ? "kRows16" : "kBlocks"));
}

TEST_CASE("cli bench --quant-kernel runs the kernel named, and refuses one the CPU lacks", "[cli][bench]") {
  const auto r = torchpatch_cli("bench --preset tiny-llama --prompt-len 8 --decode-tokens 2 --repeats 1 --no-fused "
                                "--no-blas --no-eager-attention --quant-kernel scalar --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["quant_kernel"] == "scalar");
  CHECK(j["quant_layout"] == "kBlocks");
  CHECK(j["results"].size() == 3);  // built-in, quantized q8_0 and q4_0
  const auto typo = torchpatch_cli("bench --preset tiny-llama --quant-kernel avx3");
  CHECK(typo.code != 0);
  CHECK_THAT(typo.out, Contains("--quant-kernel: 'avx3' is not a kernel (auto, avx512, avx2, scalar)"));
  if (torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx2)) {  // kRows16, 8 rows a register
    const auto avx2 = torchpatch_cli("bench --preset tiny-llama --prompt-len 8 --decode-tokens 2 --repeats 1 --no-fused "
                                     "--no-blas --no-eager-attention --no-quantized --quant-kernel AVX2 --json");
    REQUIRE(avx2.code == 0);
    CHECK(nlohmann::json::parse(avx2.out)["quant_kernel"] == "avx2");
    CHECK(nlohmann::json::parse(avx2.out)["quant_layout"] == "kRows16");
  }
  if (torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx2)) {
    // LibTorch's knob caps torchpatch's kernels too: the process runs as on an AVX2 machine.
    const auto capped = torchpatch_cli("bench --preset tiny-llama --prompt-len 8 --decode-tokens 2 --repeats 1 "
                                       "--no-fused --no-blas --no-eager-attention --no-quantized --json",
                                       "ATEN_CPU_CAPABILITY=avx2");
    INFO(capped.out);
    REQUIRE(capped.code == 0);
    CHECK(nlohmann::json::parse(capped.out)["quant_kernel"] == "avx2");
    CHECK(nlohmann::json::parse(capped.out)["cpu_capability_cap"] == "avx2");
    const auto above = torchpatch_cli("bench --preset tiny-llama --quant-kernel avx512", "ATEN_CPU_CAPABILITY=avx2");
    CHECK(above.code != 0);
    CHECK_THAT(above.out, Contains("--quant-kernel avx512: this CPU cannot run it"));
  }
  if (!torchpatch::nn::quant_kernel_available(torchpatch::nn::QuantKernel::kAvx512)) {
    const auto lacking = torchpatch_cli("bench --preset tiny-llama --quant-kernel avx512");
    CHECK(lacking.code != 0);
    CHECK_THAT(lacking.out, Contains("--quant-kernel avx512: this CPU cannot run it (it runs "));
  }
}

TEST_CASE("cli bench --compare-llama-bench prints its ratios to llama-bench's figures, and refuses a file that does "
          "not match the run", "[cli][bench]") {
  // llama-bench -o json's shape: one object per test; pp8 and tg2 at 1 thread are this run's.
  const auto entry = [](int prompt, int gen, int threads, std::vector<double> samples) {
    return nlohmann::json{{"build_commit", "0c1e570"}, {"model_filename", "tiny.gguf"}, {"model_type", "llama ?B Q4_0"},
                          {"n_threads", threads}, {"n_prompt", prompt}, {"n_gen", gen}, {"avg_ts", samples[0]},
                          {"samples_ts", samples}};
  };
  const auto file = testutil::temp_file("llama-bench.json");
  const auto write = [&](const std::string& text) { std::ofstream(file) << text; };
  const std::string run = "bench --preset tiny-llama --prompt-len 8 --decode-tokens 2 --repeats 1 --no-fused --no-blas "
                          "--no-eager-attention --no-quantized --threads 1 --compare-llama-bench " + file.string();
  write(nlohmann::json::array({entry(8, 0, 2, {1.0}), entry(8, 0, 1, {400.0, 500.0}), entry(0, 2, 1, {80.0, 100.0})}).dump());
  const auto r = torchpatch_cli(run + " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["llama_bench"]["prefill_tokens_per_second"] == 500.0);  // the best run, as bench's own
  CHECK(j["llama_bench"]["decode_tokens_per_second"] == 100.0);
  const auto& ours = j["results"][0];
  CHECK(ours["prefill_vs_llama_bench"].get<double>() == ours["prefill_tokens_per_second"].get<double>() / 500.0);
  CHECK(ours["decode_vs_llama_bench"].get<double>() == ours["decode_tokens_per_second"].get<double>() / 100.0);
  CHECK(j["decode_prompt_len"] == 1);  // llama-bench's tg decodes from an empty cache; so does the comparison
  const auto after_prompt = torchpatch_cli(run + " --decode-prompt-len 8 --json");
  REQUIRE(after_prompt.code == 0);
  CHECK(nlohmann::json::parse(after_prompt.out)["decode_prompt_len"] == 8);
  const auto table = torchpatch_cli(run);
  CHECK_THAT(table.out, Contains("decode x llama.cpp") && Contains("llama.cpp 0c1e570 on tiny.gguf"));

  write(nlohmann::json::array({entry(512, 0, 1, {1.0}), entry(0, 128, 1, {1.0})}).dump());
  const auto other = torchpatch_cli(run);
  CHECK(other.code != 0);
  CHECK_THAT(other.out, Contains(file.string()) && Contains("no pp8 and tg2 at 1 thread(s)") &&
                            Contains("pp512 at 1 thread(s), tg128 at 1 thread(s)") &&
                            Contains("llama-bench -m MODEL -t 1 -p 8 -n 2 -o json"));
  write("| model | size |\n");  // llama-bench's markdown, not its JSON
  const auto markdown = torchpatch_cli(run);
  CHECK(markdown.code != 0);
  CHECK_THAT(markdown.out, Contains("not llama-bench's JSON"));
  std::filesystem::remove(file);
  const auto missing = torchpatch_cli(run);
  CHECK(missing.code != 0);
  CHECK_THAT(missing.out, Contains("cannot read the file"));
}

TEST_CASE("cli generate --copy-weights generates what the mapped weights do", "[cli][generate]") {
  const std::string common = "generate --model " + testutil::llama_dir() + " --prompt-ids 1,2,3 --max-new-tokens 6 --ignore-eos --json";
  const auto mapped = torchpatch_cli(common), copied = torchpatch_cli(common + " --copy-weights");
  INFO(mapped.out << "\n" << copied.out);
  REQUIRE(mapped.code == 0);
  REQUIRE(copied.code == 0);
  CHECK(nlohmann::json::parse(copied.out)["rows"] == nlohmann::json::parse(mapped.out)["rows"]);
}
