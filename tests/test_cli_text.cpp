// Text in and out on the command line: tokenize / detokenize against Hugging Face's reference
// encodings, and run / generate with a text prompt on a tiny model whose embedding has the
// vocabulary of a real tokenizer (Llama-2's 32000 ids).
#include "test_prelude.h"

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/text/tokenizer.h"

using Catch::Matchers::Contains;
using namespace testutil;

namespace {

std::filesystem::path tokenizer_dir(const std::string& name) { return data_dir() / "tokenizers" / name; }

nlohmann::json read_json(const std::filesystem::path& path) {
  nlohmann::json j;
  std::ifstream(path) >> j;
  return j;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A one-layer Llama (hidden 64) with Llama-2's tokenizer whose layers add nothing, so each next
// token is read off the current token's embedding: "Hello" -> "▁world" -> "!" -> "</s>". Its
// config.json names another end token (31999), so stopping at "</s>" comes from the tokenizer.
struct ChainModel {
  ScratchDir dir{"text-chain-model"};
  int64_t world = 0, bang = 0;

  ChainModel() {
    const auto tokenizer = torchpatch::text::Tokenizer::from_pretrained(tokenizer_dir("llama2"));
    const int64_t vocab = 32000, hidden = 64, inter = 128, kv = 32;
    const int64_t hello = *tokenizer.token_to_id("\xe2\x96\x81Hello");
    world = *tokenizer.token_to_id("\xe2\x96\x81world");
    bang = *tokenizer.token_to_id("!");
    const int64_t eos = *tokenizer.eos_token_id();
    auto embed = at::zeros({vocab, hidden}), head = at::zeros({vocab, hidden});
    const int64_t chain[][2] = {{hello, world}, {world, bang}, {bang, eos}};
    for (int64_t i = 0; i < 3; ++i) {
      embed[chain[i][0]][i] = 1.0;  // the current token's direction ...
      head[chain[i][1]][i] = 1.0;   // ... is the next token's logit
    }
    const std::string layer = "model.layers.0.";
    torchpatch::checkpoint::save_safetensors(
        dir.path / "model.safetensors",
        {{"model.embed_tokens.weight", embed}, {"lm_head.weight", head}, {"model.norm.weight", at::ones({hidden})},
         {layer + "input_layernorm.weight", at::ones({hidden})},
         {layer + "post_attention_layernorm.weight", at::ones({hidden})},
         {layer + "self_attn.q_proj.weight", at::zeros({hidden, hidden})},
         {layer + "self_attn.k_proj.weight", at::zeros({kv, hidden})},
         {layer + "self_attn.v_proj.weight", at::zeros({kv, hidden})},
         {layer + "self_attn.o_proj.weight", at::zeros({hidden, hidden})},
         {layer + "mlp.gate_proj.weight", at::zeros({inter, hidden})},
         {layer + "mlp.up_proj.weight", at::zeros({inter, hidden})},
         {layer + "mlp.down_proj.weight", at::zeros({hidden, inter})}});
    std::ofstream(dir.path / "config.json")
        << nlohmann::json{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", vocab},
                          {"hidden_size", hidden}, {"intermediate_size", inter}, {"num_hidden_layers", 1},
                          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 128},
                          {"rms_norm_eps", 1e-6}, {"bos_token_id", 1}, {"eos_token_id", 31999},
                          {"tie_word_embeddings", false}}
               .dump();
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(tokenizer_dir("llama2") / file, dir.path / file);
    }
  }
};

}  // namespace

TEST_CASE("cli tokenize --jsonl encodes every reference text exactly, for three tokenizers", "[cli][text]") {
  for (const std::string name : {"llama2", "llama3", "qwen3"}) {
    const auto reference = read_json(tokenizer_dir(name) / "reference.json");
    const auto texts = temp_file(name + "-texts.jsonl"), ids = temp_file(name + "-ids.jsonl");
    {
      std::ofstream text_lines(texts), id_lines(ids);
      for (const auto& c : reference["cases"]) {
        text_lines << c["text"].dump() << "\n";
        id_lines << c["ids"].dump() << "\n";
      }
    }
    INFO(name);
    const std::string source = " --tokenizer " + tokenizer_dir(name).string() + " --jsonl ";
    const auto with = torchpatch_cli("tokenize" + source + texts.string());
    const auto without = torchpatch_cli("tokenize --no-special-tokens" + source + texts.string());
    const auto decoded = torchpatch_cli("detokenize" + source + ids.string());
    REQUIRE(with.code == 0);
    REQUIRE(without.code == 0);
    REQUIRE(decoded.code == 0);
    const auto with_lines = lines_of(with.out), without_lines = lines_of(without.out), text_lines = lines_of(decoded.out);
    REQUIRE(with_lines.size() == reference["cases"].size());
    REQUIRE(without_lines.size() == reference["cases"].size());
    REQUIRE(text_lines.size() == reference["cases"].size());
    size_t mismatches = 0;
    for (size_t i = 0; i < reference["cases"].size(); ++i) {
      const auto& c = reference["cases"][i];
      mismatches += nlohmann::json::parse(with_lines[i]) != c["ids_with_special_tokens"];
      mismatches += nlohmann::json::parse(without_lines[i]) != c["ids"];
      mismatches += nlohmann::json::parse(text_lines[i]) != c["decoded"];
    }
    CHECK(mismatches == 0);
    std::filesystem::remove(texts);
    std::filesystem::remove(ids);
  }
}

TEST_CASE("cli tokenize and detokenize one text, with tokens and offsets", "[cli][text]") {
  const std::string llama3 = " --tokenizer " + tokenizer_dir("llama3").string();
  const auto ids = torchpatch_cli("tokenize" + llama3 + " 'Hello world'");
  REQUIRE(ids.code == 0);
  CHECK(ids.out == "9906,1917\n");  // this tokenizer.json adds no BOS (its reference neither)
  const auto json = torchpatch_cli("tokenize --json --no-special-tokens" + llama3 + " 'Hello world'");
  REQUIRE(json.code == 0);
  const auto j = nlohmann::json::parse(json.out);
  CHECK(j["ids"] == nlohmann::json({9906, 1917}));
  CHECK(j["tokens"] == nlohmann::json({"Hello", "\xc4\xa0world"}));
  CHECK(j["offsets"] == nlohmann::json({{0, 5}, {5, 11}}));
  const auto text = torchpatch_cli("detokenize --skip-special-tokens" + llama3 + " 128000,9906,1917");
  CHECK(text.out == "Hello world\n");
  const auto spaced = torchpatch_cli("detokenize --json" + llama3 + " '128000 9906 1917'");
  CHECK(spaced.out == "\"<|begin_of_text|>Hello world\"\n");
  // A text that starts with dashes, after "--"; standard input with "-".
  const auto dashes = torchpatch_cli("tokenize --no-special-tokens" + llama3 + " -- --x");
  CHECK(dashes.code == 0);
  CHECK(dashes.out == torchpatch_cli("tokenize --no-special-tokens" + llama3 + " -", "printf '%s' --x |").out);
  const auto debug = torchpatch_cli("tokenize --no-special-tokens" + llama3 + " -- --debug");  // a text, not the flag
  CHECK(debug.code == 0);
  CHECK(debug.out == torchpatch_cli("tokenize --no-special-tokens" + llama3 + " -", "printf '%s' --debug |").out);
}

TEST_CASE("cli tokenize and detokenize: bad arguments and bad input", "[cli][text][errors]") {
  const std::string llama3 = " --tokenizer " + tokenizer_dir("llama3").string();
  const auto bad_lines = temp_file("bad.jsonl");
  std::ofstream(bad_lines) << "\"fine\"\n[1, 2]\n";
  const auto bad_ids = temp_file("bad-ids.jsonl");
  std::ofstream(bad_ids) << "[1, 2]\n{\"ids\": 1}\n";
  ScratchDir no_tokenizer("text-no-tokenizer");
  struct Case {
    std::string args;
    int code;
    std::string message;
  } cases[] = {
      {"tokenize hello", 2, "give --model DIR or --tokenizer DIR"},
      {"tokenize" + llama3, 2, "give exactly one of TEXT and --jsonl FILE"},
      {"tokenize" + llama3 + " a b", 2, "unexpected argument 'b'"},
      {"tokenize --tokenizer " + no_tokenizer.path.string() + " hi", 1, "tokenizer.json"},
      {"tokenize" + llama3 + " --jsonl " + bad_lines.string(), 1, "line 2: expected a JSON string"},
      {"tokenize" + llama3 + " --jsonl /nonexistent/x.jsonl", 1, "cannot open it"},
      {"tokenize" + llama3 + " \"$(printf '\\377')\"", 1, "UTF-8"},
      {"detokenize" + llama3 + " 1,x", 2, "'x' is not an integer"},
      {"detokenize" + llama3 + " 999999999", 1, "999999999"},
      {"detokenize" + llama3 + " --jsonl " + bad_ids.string(), 1, "line 2: expected a JSON array of token ids"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli(c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == c.code);
    CHECK_THAT(r.out, Contains(c.message));
  }
  std::filesystem::remove(bad_lines);
  std::filesystem::remove(bad_ids);
}

TEST_CASE("cli generate --prompt streams the text and stops at the tokenizer's end token", "[cli][text][generate]") {
  const ChainModel model;
  const std::string base = "generate --model " + model.dir.path.string() + " --prompt Hello";
  const auto both = torchpatch_cli(base + " --max-new-tokens 10");
  INFO(both.out);
  REQUIRE(both.code == 0);
  const auto r = torchpatch_cli(base + " --max-new-tokens 10 2>/dev/null | cat");  // stdout only: the text
  CHECK(r.out == "Hello world!\n");
  const auto report = torchpatch_cli(base + " --max-new-tokens 10 2>&1 >/dev/null | cat");  // stderr: ids, speeds
  CHECK_THAT(report.out, Contains(fmt::format("row 0: {} {} 2\n", model.world, model.bang)));
  CHECK_THAT(report.out, Contains("decode:  2 tokens"));

  const auto json = torchpatch_cli(base + " --max-new-tokens 10 --json");
  REQUIRE(json.code == 0);
  const auto j = nlohmann::json::parse(json.out);
  CHECK(j["rows"][0]["new_ids"] == nlohmann::json({model.world, model.bang, 2}));
  CHECK(j["rows"][0]["text"] == " world!");

  // --ignore-eos runs on past "</s>" (the chain then has nothing to say: token 0, "<unk>").
  const auto on = torchpatch_cli(base + " --ignore-eos --max-new-tokens 4 --json");
  REQUIRE(on.code == 0);
  CHECK(nlohmann::json::parse(on.out)["rows"][0]["new_ids"].size() == 4);

  // The same prompt from a file, and the tokenizer given separately.
  const auto prompt = temp_file("prompt.txt");
  std::ofstream(prompt) << "Hello";
  const auto from_file = torchpatch_cli("generate --model " + model.dir.path.string() + " --prompt-file " +
                                        prompt.string() + " --tokenizer " + tokenizer_dir("llama2").string() +
                                        " --json");
  CHECK(nlohmann::json::parse(from_file.out)["rows"][0]["text"] == " world!");
  std::filesystem::remove(prompt);
}

TEST_CASE("cli save carries the tokenizer: the copy generates from text as the original does", "[cli][text][save]") {
  const ChainModel model;
  std::ofstream(model.dir.path / "generation_config.json") << R"({"eos_token_id": 2})";
  const ScratchDir copy("text-chain-model-saved");
  const auto saved = torchpatch_cli("save --model " + model.dir.path.string() + " --out " + copy.path.string());
  INFO(saved.out);
  REQUIRE(saved.code == 0);
  // It says what it wrote.
  CHECK_THAT(saved.out, Contains("config.json, generation_config.json, model.safetensors (16.5 MB), tokenizer.json (1.8 MB), tokenizer_config.json"));
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    INFO(file);
    REQUIRE(std::filesystem::exists(copy.path / file));
    std::ifstream a(model.dir.path / file, std::ios::binary), b(copy.path / file, std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(a), {}) == std::string(std::istreambuf_iterator<char>(b), {}));
  }
  const auto r = torchpatch_cli("generate --model " + copy.path.string() + " --prompt Hello --max-new-tokens 10 2>/dev/null | cat");
  CHECK(r.out == "Hello world!\n");
}

TEST_CASE("cli run --prompt shows the next tokens as text", "[cli][text]") {
  const ChainModel model;
  const auto r = torchpatch_cli("run --model " + model.dir.path.string() + " --prompt Hello --top 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains(fmt::format("next tokens at position 1: {} 'world' (", model.world)));
}

TEST_CASE("cli text prompts: bad arguments", "[cli][text][errors]") {
  const std::string llama2 = tokenizer_dir("llama2").string();
  struct Case {
    std::string args;
    int code;
    std::string message;
  } cases[] = {
      {"generate --preset tiny-llama --prompt Hello", 2, "a text prompt needs a tokenizer"},
      {"run --preset tiny-llama --prompt-ids 1 --tokenizer " + llama2, 2, "--tokenizer: only with --prompt"},
      {"generate --preset tiny-llama --prompt Hi --prompt-ids 1 --tokenizer " + llama2, 2, "give exactly one of"},
      {"generate --preset tiny-llama --prompt-file /nonexistent/p.txt --tokenizer " + llama2, 1, "cannot open it"},
      // Llama-2's ids do not fit the tiny preset's 256-token vocabulary.
      {"generate --preset tiny-llama --prompt Hello --tokenizer " + llama2, 1, "(32000 ids) is not this model's; give --tokenizer the directory of the model's own tokenizer.json"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli(c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == c.code);
    CHECK_THAT(r.out, Contains(c.message));
  }
}
