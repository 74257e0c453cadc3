// The torchpatch CLI as a user runs it: outputs, reference parity, usage errors and exit codes.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/device.h"
#include "torchpatch/checkpoint/checkpoint.h"
#include "torchpatch/version.h"

using Catch::Matchers::Contains;
using namespace testutil;
namespace fs = std::filesystem;


TEST_CASE("cli run on llama_basic writes the reference logits and hidden states", "[cli][reference]") {
  const auto out = temp_file("llama.safetensors");
  const auto r = torchpatch_cli("run --model " + llama_dir() + " --inputs " + llama_dir() +
                                "/reference.safetensors --hidden-states --output " + out.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("row 1 next tokens at position 11"));
  auto ref = torchpatch::checkpoint::SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "reference.safetensors");
  auto got = torchpatch::checkpoint::SafetensorsFile::open(out);
  const auto mask = ref->tensor("attention_mask");
  CHECK(testutil::close("cli logits", got->tensor("logits"), ref->tensor("logits"), mask));
  CHECK(testutil::close("cli hidden_states", got->tensor("hidden_states"), ref->tensor("hidden_states"),
                        mask.unsqueeze(0)));
}

TEST_CASE("cli run with the bundled CustomLlamaAttention gives the same logits and counts its calls", "[cli]") {
  const auto plain = temp_file("plain.safetensors"), patched = temp_file("patched.safetensors");
  const auto base = "run --model " + llama_dir() + " --inputs " + llama_dir() + "/reference.safetensors --output ";
  REQUIRE(torchpatch_cli(base + plain.string()).code == 0);
  const auto r = torchpatch_cli(base + patched.string() + " --patch LlamaAttention=CustomLlamaAttention");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("CustomLlamaAttention: calls=3 (3 modules)"));
  auto a = torchpatch::checkpoint::SafetensorsFile::open(plain);
  auto b = torchpatch::checkpoint::SafetensorsFile::open(patched);
  CHECK(at::equal(a->tensor("logits"), b->tensor("logits")));
}

TEST_CASE("cli run with --prompt-ids on a preset", "[cli]") {
  const auto r = torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2,3 --patch LlamaAttention=CustomLlamaAttention --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["rows"].size() == 1);
  CHECK(j["rows"][0]["position"] == 2);
  CHECK(j["rows"][0]["top"].size() == 5);
  CHECK(j["counters"][0] == "CustomLlamaAttention: calls=2 (2 modules)");
  // A preset has fixed weights: the same run gives the same answer.
  CHECK(nlohmann::json::parse(torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2,3 --json").out)["rows"] == j["rows"]);
}

TEST_CASE("cli plan shows the swap on every layer", "[cli]") {
  const auto r = torchpatch_cli("plan --preset tiny-llama --patch LlamaAttention=CustomLlamaAttention");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(count(r.out, "LlamaAttention -> CustomLlamaAttention  [exact key; plugin custom-llama-attention 1.0.0") == 2);
  CHECK_THAT(r.out, Contains("2 of 27 patch points replaced"));  // 12 blocks and 15 projections
  const auto j = nlohmann::json::parse(torchpatch_cli("plan --preset tiny-llama --json --patch .*Attention$=CustomLlamaAttention").out);
  int patched = 0;
  for (const auto& p : j["patch_points"]) {
    if (p["patched"]) {
      ++patched;
      CHECK(p["class"] == "CustomLlamaAttention");
      CHECK(p["rule"] == "pattern '.*Attention$'");
    }
  }
  CHECK(patched == 2);
}

TEST_CASE("cli plan names keys that matched nothing, with a suggestion, and --strict makes it an error", "[cli]") {
  const auto r = torchpatch_cli("plan --preset tiny-llama --patch LlamaAtention=CustomLlamaAttention");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("registered key 'LlamaAtention' matched nothing; did you mean 'LlamaAttention'?"));
  const auto strict = torchpatch_cli("plan --preset tiny-llama --strict --patch LlamaAtention=CustomLlamaAttention");
  CHECK(strict.code == 1);
  CHECK_THAT(strict.out, Contains("--strict: patch key 'LlamaAtention' matched no patch point"));
}

TEST_CASE("cli a --patch key or --keep-float pattern that matches nothing is a warning on every command", "[cli]") {
  // The model still runs (without what was asked), the warning names the key and the likely one;
  // --strict makes it an error.
  const auto run = torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2 --patch LlamaAtention=CustomLlamaAttention");
  INFO(run.out);
  CHECK(run.code == 0);
  CHECK_THAT(run.out, Contains("torchpatch: warning: --patch key 'LlamaAtention' matched no patch point of "
                               "LlamaForCausalLM; did you mean 'LlamaAttention'?; it runs without that patch"));
  const auto generate = torchpatch_cli("generate --preset tiny-llama --prompt-ids 1,2 --max-new-tokens 1 "
                                       "--patch LlamaAtention=CustomLlamaAttention");
  CHECK(generate.code == 0);
  CHECK_THAT(generate.out, Contains("--patch key 'LlamaAtention' matched no patch point"));

  const auto keep = torchpatch_cli("run --model " + llama_dir() + " --prompt-ids 1,2 --quantize q8_0 --keep-float lmhead");
  INFO(keep.out);
  CHECK(keep.code == 0);
  CHECK_THAT(keep.out, Contains("torchpatch: warning: --keep-float 'lmhead' matched no module of LlamaForCausalLM; did "
                                "you mean 'lm_head'?; nothing more is kept in float (--strict makes this an error)"));
  const auto kept = torchpatch_cli("run --model " + llama_dir() + " --prompt-ids 1,2 --quantize q8_0 --keep-float lm_head");
  CHECK(kept.code == 0);
  CHECK_THAT(kept.out, !Contains("warning"));
  const auto strict = torchpatch_cli("run --model " + llama_dir() + " --prompt-ids 1,2 --quantize q8_0 --keep-float lmhead --strict");
  CHECK(strict.code == 1);
  CHECK_THAT(strict.out, Contains("--strict: --keep-float 'lmhead' matched no module"));
}

TEST_CASE("cli --version names torchpatch, LibTorch and the CPU extensions in use", "[cli]") {
  const auto r = torchpatch_cli("--version");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains(fmt::format("torchpatch {}.{}.{}\n", TORCHPATCH_VERSION_MAJOR, TORCHPATCH_VERSION_MINOR,
                                         TORCHPATCH_VERSION_PATCH)));
  CHECK_THAT(r.out, Contains("LibTorch "));
  CHECK_THAT(r.out, Contains(torchpatch::cuda_built() ? "CUDA: built (libtorchpatch_cuda" : "CUDA: not built"));
  CHECK_THAT(r.out, Contains("CPU extensions in use: "));
  CHECK_THAT(r.out, Contains("quantized kernels: the "));
}

TEST_CASE("cli every command spells a concept one way: --output, --prompt-ids, --top-k, --threads, --json", "[cli]") {
  // Each command's --help lists its options; the older spellings are accepted but never shown.
  struct Command {
    std::string name;
    bool model;  // builds a model: --threads
  };
  const std::vector<Command> commands{{"plan", true},           {"run", true},    {"save", true},
                                      {"generate", true},       {"bench", true},  {"verify", true},
                                      {"routing record", true}, {"routing replay", true}, {"plugins", false},
                                      {"tokenize", false},      {"detokenize", false}};
  for (const auto& c : commands) {
    const auto r = torchpatch_cli(c.name + " --help");
    INFO(c.name << "\n" << r.out);
    CHECK(r.code == 0);
    for (const char* old : {"--out ", "--ids ", "--top "}) CHECK(r.out.find(old) == std::string::npos);
    CHECK_THAT(r.out, Contains("--json"));
    if (c.model) CHECK_THAT(r.out, Contains("--threads N"));
  }
  // The older spellings still work.
  const ScratchDir saved("cli-old-spelling");
  CHECK(torchpatch_cli("save --preset tiny-llama --out " + saved.path.string()).code == 0);
  CHECK(std::filesystem::exists(saved.path / "config.json"));
  const auto top = torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2 --top 1 --json");
  REQUIRE(top.code == 0);
  CHECK(nlohmann::json::parse(top.out)["rows"][0]["top"].size() == 1);
}

TEST_CASE("cli sizes read as numbers or with units; save and routing record print JSON when asked", "[cli]") {
  const ScratchDir dir("cli-sizes");
  const auto small = torchpatch_cli("save --preset tiny-llama --max-shard-bytes 100KB --json --output " + dir.path.string());
  INFO(small.out);
  REQUIRE(small.code == 0);
  const auto j = nlohmann::json::parse(small.out);
  CHECK(j["weights"] == "float");
  int shards = 0;
  for (const auto& file : j["files"]) {
    shards += file["name"].get<std::string>().rfind("model-", 0) == 0;
    CHECK(std::filesystem::file_size(dir.path / file["name"].get<std::string>()) == file["bytes"].get<std::uintmax_t>());
  }
  CHECK(shards > 1);
  CHECK(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 5e9 --output " + dir.path.string()).code == 0);
  const auto bad = torchpatch_cli("save --preset tiny-llama --max-shard-bytes lots --output " + dir.path.string());
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("--max-shard-bytes: 'lots' is not a size in bytes (e.g. 5000000000, 5e9, 5GB, 512MB, 4GiB)"));

  const auto routes = temp_file("cli-json-routes.npy");
  const auto record = torchpatch_cli("routing record --preset tiny-mixtral --prompt-ids 1,2,3 --json --output " +
                                     routes.string());
  INFO(record.out);
  REQUIRE(record.code == 0);
  const auto r = nlohmann::json::parse(record.out);
  CHECK(r["tokens"] == nlohmann::json({1, 2, 3}));
  CHECK(r["output"] == routes.string());
  CHECK(std::filesystem::exists(routes));
  std::filesystem::remove(routes);
}

TEST_CASE("cli --threads sets the intra-op threads of every model command", "[cli]") {
  const auto r = torchpatch_cli("bench --preset tiny-llama --prompt-len 4 --decode-tokens 2 --repeats 1 --no-fused "
                                "--no-blas --no-quantized --threads 2 --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(r.out.substr(r.out.find('{')))["threads"] == 2);
  const auto bad = torchpatch_cli("run --preset tiny-llama --prompt-ids 1 --threads 0");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("--threads: expected one integer >= 1, got '0'"));
}

TEST_CASE("cli plugins lists the bundled plugins", "[cli][plugins]") {
  const auto r = torchpatch_cli("plugins --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  bool found = false;
  for (const auto& p : j["plugins"]) {
    if (p["name"] == "custom-llama-attention") {
      found = true;
      CHECK(p["status"] == "loaded");
      CHECK(p["mode"] == "bundled");
      CHECK(p["classes"][0]["name"] == "CustomLlamaAttention");
    }
  }
  CHECK(found);
}

TEST_CASE("cli usage errors exit with 2 and say what is wrong", "[cli][errors]") {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases{
      {"", "usage: torchpatch <command>"},
      {"frobnicate", "unknown command 'frobnicate'"},
      {"run --preset tiny-llama --prompt-ids 1,2 --bogus", "unknown option '--bogus'"},
      {"run --prompt-ids 1,2", "give exactly one of --model DIR and --preset NAME"},
      {"run --preset tiny-llama", "give exactly one of --prompt, --prompt-file, --prompt-ids and --inputs"},
      {"run --preset tiny-llama --prompt-ids 1,x", "--prompt-ids: 'x' is not an integer"},
      {"run --preset tiny-llama --prompt-ids", "option '--prompt-ids' needs a value"},
      {"run --preset tiny-llama --prompt-ids 1 --patch LlamaAttention", "--patch 'LlamaAttention': expected KEY=CLASS"},
      {"plan --preset tiny-llama --model x", "give exactly one of --model DIR and --preset NAME"},
      {"run --preset tiny-llama --prompt-ids 1 --hidden-states", "--hidden-states needs --output FILE"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli(c.args);
    INFO("torchpatch " << c.args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(c.message));
  }
}

TEST_CASE("cli option values are taken as given: dashes, brackets, commas; flags take none", "[cli]") {
  // A value may start with '-' or hold brackets and commas; an argument after "--" is never an option.
  const auto tokenizer = (data_dir() / "tokenizers" / "llama2").string();
  const auto bracket = torchpatch_cli("tokenize --tokenizer " + tokenizer + " --json '[INST]'");
  const auto plain = torchpatch_cli("tokenize --tokenizer " + tokenizer + " --json INST");
  REQUIRE(bracket.code == 0);
  CHECK(nlohmann::json::parse(bracket.out)["tokens"] != nlohmann::json::parse(plain.out)["tokens"]);
  CHECK(nlohmann::json::parse(bracket.out)["tokens"].size() > nlohmann::json::parse(plain.out)["tokens"].size());
  const auto dash = torchpatch_cli("tokenize --tokenizer " + tokenizer + " --json -- -x");
  REQUIRE(dash.code == 0);
  CHECK(nlohmann::json::parse(dash.out)["tokens"].size() >= 1);
  const auto prompt = torchpatch_cli("run --preset tiny-llama --prompt-ids 1 --output=/dev/null --top-k=1");
  CHECK(prompt.code == 0);
  struct Case {
    std::string args, message;
  };
  for (const auto& c : {Case{"run --preset tiny-llama --prompt-ids 1 --quiet=false", "option '--quiet' takes no value"},
                        Case{"run --preset tiny-llama --prompt-ids= --json", "--prompt-ids: empty list"},
                        Case{"run --preset tiny-llama --prompt-ids 1 --top-k 1 --top 2", "option '--top-k' given twice"}}) {
    const auto r = torchpatch_cli(c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(c.message));
  }
}

TEST_CASE("cli runtime errors exit with 1 and name the cause", "[cli][errors]") {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases{
      {"run --model /nonexistent/dir --prompt-ids 1", "/nonexistent/dir: no such file or directory"},
      {"run --preset tiny-llama --prompt-ids 1,999", "token id 999 at [0, 1] is out of range for vocab_size 256"},
      {"run --preset tiny-llama --prompt-ids 1 --patch LlamaAttention=Nope", "no class named 'Nope'"},
      {"run --preset nope --prompt-ids 1", "unknown preset 'nope' (presets: tiny-bert, "},
      {"run --preset nope --prompt-ids 1", " tiny-llama, llama-125m, llama3-8b, tiny-mistral, "},
      {"run --preset tiny-llama --prompt-ids 1 --patch LlamaMLP=CustomLlamaAttention",
       "has role Attention, but 'LlamaMLP' is a patch point of role Mlp"},
      {"run --preset tiny-llama --prompt-ids 1 --patch Llama=CustomLlamaAttention",
       "needs role CausalLM, but pattern 'Llama' maps it to 'CustomLlamaAttention' of role Attention"},
      {"run --preset tiny-llama --inputs /nonexistent.safetensors", "/nonexistent.safetensors"},
      {"plan --preset tiny-llama --plugin-dir /nonexistent/plugins --strict", "plugin directory does not exist"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli(c.args);
    INFO("torchpatch " << c.args << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Contains(c.message));
  }
}

TEST_CASE("cli errors a user runs into name the fix", "[cli][errors]") {
  const ScratchDir pickled("cli-pickled-checkpoint");
  fs::copy_file(data_dir() / "llama_basic" / "config.json", pickled.path / "config.json");
  std::ofstream(pickled.path / "pytorch_model.bin") << "not read";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases{
      // The weights file instead of its directory.
      {"run --model " + llama_dir() + "/model.safetensors --prompt-ids 1",
       "model.safetensors: a weights file, not a checkpoint: give the directory that holds it and its config.json (" +
           llama_dir() + ")"},
      // PyTorch's pickle format only.
      {"run --model " + pickled.path.string() + " --prompt-ids 1",
       "no model.safetensors or model.safetensors.index.json; it holds pytorch_model.bin, PyTorch's pickle format, "
       "which torchpatch does not read"},
      // Another model's tokenizer.
      {"run --model " + llama_dir() + " --prompt Hello --tokenizer " + (data_dir() / "tokenizers" / "llama3").string(),
       "the prompt's token id 9906 is beyond LlamaForCausalLM's vocabulary (256 ids): the tokenizer of " +
           (data_dir() / "tokenizers" / "llama3").string() + " (128256 ids) is not this model's; give --tokenizer"},
      // A pattern that is not a regular expression, in a few words.
      {"run --preset tiny-llama --prompt-ids 1 --patch '(Llama=CustomLlamaAttention'",
       "Invalid regex pattern '(Llama': an unmatched '(' or ')' at position"},
      // Every projection --quantize cannot take, in one message, with the flags that keep them in float.
      {"run --model " + (data_dir() / "deepseek_v3_mla_v5").string() + " --prompt-ids 1 --quantize q4_0",
       "3 projections of " + (data_dir() / "deepseek_v3_mla_v5").string() + " cannot be quantized, their input "
       "widths not being multiples of 32 (the block size): model.layers.0.self_attn.q_b_proj (48), "
       "model.layers.1.self_attn.q_b_proj (48), model.layers.2.self_attn.q_b_proj (48); keep them in float with "
       "--keep-float q_b_proj"},
  };
  for (const auto& c : cases) {
    const auto r = torchpatch_cli(c.args);
    INFO("torchpatch " << c.args << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Contains(c.message));
  }
  CHECK(torchpatch_cli("run --model " + (data_dir() / "deepseek_v3_mla_v5").string() +
                       " --prompt-ids 1 --quantize q4_0 --keep-float q_b_proj").code == 0);
}

TEST_CASE("cli progress: a line per stage in a log, a bar on a terminal, nothing under --quiet", "[cli]") {
  // --progress shows a stage from its start (by default only past two seconds, which these tiny
  // checkpoints never reach).
  const ScratchDir out("cli-progress");
  const std::string save = "save --model " + llama_dir() + " --quantize q8_0 --output " + out.path.string();
  const auto log = torchpatch_cli(save + " --progress");
  INFO(log.out);
  REQUIRE(log.code == 0);
  CHECK_THAT(log.out, Contains("loading " + llama_dir() + " (quantizing to q8_0): "));
  CHECK_THAT(log.out, Contains("saving to " + out.path.string() + ": "));
  CHECK_THAT(log.out, Contains(" MB/s)\n"));
  CHECK(log.out.find('\r') == std::string::npos);  // a log gets lines, not a redrawn bar
  CHECK_THAT(log.out, Contains("weights written as q8_0 blocks with their quantization_config"));

  // On a pseudo-terminal (script(1)): the bar, redrawn in place, at 100% when done.
  const auto tty = shell("script -qec \"" + std::string(TORCHPATCH_CLI) + " " + save + " --progress\" /dev/null");
  INFO(tty.out);
  CHECK(tty.code == 0);
  CHECK_THAT(tty.out, Contains("\rsaving to " + out.path.string() + " [##############################] 100% "));

  // By default a short stage shows nothing; --quiet shows nothing at all, warnings included.
  CHECK(torchpatch_cli(save).out.find("loading ") == std::string::npos);
  const auto quiet = torchpatch_cli(save + " --progress --quiet --keep-float lmhead");
  CHECK(quiet.code == 0);
  CHECK(quiet.out.find("loading ") == std::string::npos);
  CHECK(quiet.out.find("warning") == std::string::npos);
  CHECK_THAT(quiet.out, Contains("saved LlamaForCausalLM"));  // the result itself is not progress
}

TEST_CASE("cli --help works for every command", "[cli]") {
  for (const std::string command :
       {"--help", "plugins --help", "plan --help", "run --help", "save --help", "generate --help", "bench --help"}) {
    const auto r = torchpatch_cli(command);
    INFO(command << "\n" << r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("usage: torchpatch"));
  }
}

TEST_CASE("cli plugins --json lists every refused test plugin with its reason", "[cli][plugins]") {
  const auto r = torchpatch_cli("plugins --json --plugin-dir " + std::string(TORCHPATCH_TEST_PLUGIN_DIR) + "/refused");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, std::string> reasons;  // file name -> reason of refused plugins
  for (const auto& p : j["plugins"]) {
    if (p["status"] == "refused") reasons[fs::path(p["path"].get<std::string>()).filename().string()] = p["reason"];
  }
  CHECK_THAT(reasons["not_a_plugin.so"], Contains("not a loadable shared object"));
  CHECK_THAT(reasons["testplugin_missing_entry.so"], Contains("missing entry point 'torchpatch_plugin_descriptor'"));
  CHECK_THAT(reasons["testplugin_abi_mismatch.so"], Contains("plugin ABI version 99"));
  CHECK_THAT(reasons["testplugin_torch_mismatch.so"], Contains("LibTorch 1.12.0"));
  CHECK_THAT(reasons["testplugin_register_throws.so"], Contains("register function threw: boom: cannot initialise"));
  CHECK_THAT(reasons["testplugin_invalid_regex.so"], Contains("Invalid regex pattern 'Llama(Attention'"));
  CHECK_THAT(reasons["testplugin_role_mismatch.so"], Contains("role Attention"));
  CHECK_THAT(reasons["testplugin_conflict_b.so"], Contains("key 'LlamaMLP' conflicts"));
  CHECK_THAT(reasons["testplugin_conversion_conflict_b.so"],
             Contains("conversion mapping for 'conversion_conflict_type' conflicts: already registered by plugin "
                      "torchpatch-test-conversion-conflict-a 0.1.0"));
  CHECK(reasons.size() == 9);
}

TEST_CASE("cli drop-in plugins from --plugin-dir and TORCHPATCH_PLUGIN_PATH apply their keys", "[cli][plugins]") {
  const std::string dir = std::string(TORCHPATCH_TEST_PLUGIN_DIR) + "/good";
  auto replaced_mlps = [](const Result& r) {
    INFO(r.out);
    REQUIRE(r.code == 0);
    int replaced = 0;
    const auto plan = nlohmann::json::parse(r.out);
    for (const auto& p : plan["patch_points"]) {
      if (p["key"] == "LlamaMLP" && p["patched"]) ++replaced;
    }
    return replaced;
  };
  CHECK(replaced_mlps(torchpatch_cli("plan --preset tiny-llama --json")) == 0);
  CHECK(replaced_mlps(torchpatch_cli("plan --preset tiny-llama --json --plugin-dir " + dir)) == 2);
  CHECK(replaced_mlps(torchpatch_cli("plan --preset tiny-llama --json", "TORCHPATCH_PLUGIN_PATH=" + dir)) == 2);
}

TEST_CASE("cli save with FusedQKVAttention writes the hub layout back bit-exactly", "[cli][conversion]") {
  const auto out = temp_file("saved");
  fs::remove_all(out);
  const auto r = torchpatch_cli("save --model " + llama_dir() + " --out " + out.string() +
                                " --patch LlamaAttention=FusedQKVAttention --max-shard-bytes 200000");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("saved LlamaForCausalLM"));
  const auto original = torchpatch::checkpoint::Checkpoint::open(llama_dir());
  const auto saved = torchpatch::checkpoint::Checkpoint::open(out);
  CHECK(saved.files().size() > 1);
  REQUIRE(saved.keys() == original.keys());
  for (const auto& key : original.keys()) CHECK(at::equal(saved.tensor(key), original.tensor(key)));
}

TEST_CASE("cli plan --json reports the conversions the checkpoint went through", "[cli][conversion]") {
  const auto r = torchpatch_cli("plan --json --model " + llama_dir() + " --patch LlamaAttention=FusedQKVAttention");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["load_report"]["conversions"].size() == 1);
  CHECK_THAT(j["load_report"]["conversions"][0].get<std::string>(), Contains("Concatenate(dim=0, sizes=[64, 32, 32])"));
  CHECK(j["load_report"]["missing"].empty());
}

TEST_CASE("cli loads a checkpoint that does not fit only with --allow-incomplete, and says what is wrong", "[cli][conversion]") {
  const auto dir = temp_file("incomplete");
  fs::create_directories(dir);
  fs::copy_file(llama_dir() + "/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const auto original = torchpatch::checkpoint::Checkpoint::open(llama_dir());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& key : original.keys()) {
    if (key != "model.layers.2.mlp.gate_proj.weight") tensors.emplace_back(key, original.tensor(key));
  }
  torchpatch::checkpoint::save_safetensors(dir / "model.safetensors", tensors);
  const auto strict = torchpatch_cli("run --prompt-ids 1,2,3 --model " + dir.string());
  CHECK(strict.code == 1);
  CHECK_THAT(strict.out, Contains("missing tensor 'model.layers.2.mlp.gate_proj.weight'"));
  const auto lenient = torchpatch_cli("run --prompt-ids 1,2,3 --allow-incomplete --model " + dir.string());
  INFO(lenient.out);
  CHECK(lenient.code == 0);
  CHECK_THAT(lenient.out, Contains("missing tensor 'model.layers.2.mlp.gate_proj.weight' (left initialised)"));
}

TEST_CASE("cli --dtype", "[cli][dtype]") {
  CHECK(torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2 --dtype bfloat16").code == 0);
  const auto bad = torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2 --dtype float64");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("--dtype: 'float64' is not one of float32, bfloat16, float16"));
  CHECK(torchpatch_cli("save --preset tiny-llama").code == 2);
}
