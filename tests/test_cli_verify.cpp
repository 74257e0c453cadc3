// torchpatch verify on every bundled plugin's reference case, its failures, and `run` on BERT.
#include "test_prelude.h"
#include "cli_util.h"

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/runtime/auto.h"

using namespace testutil;
using Catch::Matchers::Contains;

namespace {

// `verify --json` on a reference case with its own inputs; the parsed report.
nlohmann::json verify(const std::string& case_name, const std::string& extra, int expected_code = 0) {
  const auto dir = (data_dir() / case_name).string();
  const auto r = torchpatch_cli("verify --model " + dir + " --inputs " + dir + "/reference.safetensors --repeat 1 --json " + extra);
  INFO(r.out);
  REQUIRE(r.code == expected_code);
  return nlohmann::json::parse(r.out.substr(r.out.find('{')));
}

void check_passes(const nlohmann::json& report, std::size_t replaced) {
  INFO(report.dump(2));
  CHECK(report["pass"] == true);
  CHECK(report["replaced"].size() == replaced);
  for (const auto& output : report["outputs"]) {
    CHECK(output["ok"] == true);
    CHECK(output["max_abs_diff"].get<double>() <= 1e-4);
  }
  CHECK(report["speed_ratio"].get<double>() > 0.0);
  if (report.contains("expert_choices")) {
    CHECK(report["expert_choices"]["rows"] == 40);  // 2 sparse layers x 20 real tokens
    CHECK(report["expert_choices"]["agree"] == report["expert_choices"]["rows"]);
  }
}

}  // namespace

TEST_CASE("cli verify passes for every bundled plugin on its reference case", "[cli][verify]") {
  check_passes(verify("llama_basic", "--patch LlamaAttention=CustomLlamaAttention"), 3);
  check_passes(verify("llama_basic", "--patch LlamaAttention=FusedQKVAttention"), 3);
  check_passes(verify("mistral_sliding_window", "--patch MistralAttention=FusedQKVAttention"), 2);
  for (const auto* family : {"qwen2_moe", "qwen3_moe"}) {
    const std::string moe = family == std::string("qwen2_moe") ? "Qwen2Moe" : "Qwen3Moe";
    const std::string case_name = std::string(family) + "_basic";
    const auto experts = verify(case_name, "--patch " + moe + "Experts=SequentialExperts");
    check_passes(experts, 2);
    CHECK(experts["outputs"].size() == 7);  // logits, last hidden, 3 hidden states, 2 router logits
    check_passes(verify(case_name, "--patch " + moe + "TopKRouter=ReplayableTopKRouter"), 2);
  }
}

TEST_CASE("cli verify reports differences past the tolerance and exits 1", "[cli][verify]") {
  // Q8_0 weights move the logits by up to 0.26: nothing passes a zero tolerance, nor a mean KL of 1e-6.
  // (The bundled float replacements, FusedQKVAttention among them, now equal the original exactly.)
  const auto report = verify("llama_basic", "--quantize q8_0 --max-kl 1e-6 --atol 0 --rtol 0", 1);
  CHECK(report["pass"] == false);
  bool logits_failed = false;
  for (const auto& output : report["outputs"]) {
    if (output["name"] == "logits") logits_failed = output["ok"] == false && output["max_abs_diff"].get<double>() > 0;
  }
  CHECK(logits_failed);

  // A router that picks other experts: the choices disagree, and the text report says so.
  const auto dir = (data_dir() / "qwen2_moe_basic").string();
  const auto r = torchpatch_cli("verify --model " + dir + " --inputs " + dir + "/reference.safetensors --repeat 1 " +
                                "--plugin-dir " + TORCHPATCH_TEST_PLUGIN_DIR + "/least_likely_router");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("model.layers.0.mlp.gate: Qwen2MoeTopKRouter -> LeastLikelyRouter"));
  CHECK_THAT(r.out, Contains("(DIFFERENT)"));
  CHECK_THAT(r.out, Contains("FAIL"));
}

TEST_CASE("cli verify: nothing replaced, bad tolerances and bad patches are clear errors", "[cli][verify]") {
  auto r = torchpatch_cli("verify --preset tiny-llama");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("nothing to verify: no patch point of LlamaForCausalLM is replaced"));
  r = torchpatch_cli("verify --preset tiny-llama --patch LlamaAttention=FusedQKVAttention --atol abc");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--atol"));
  r = torchpatch_cli("verify --preset tiny-llama --patch LlamaAttention=NoSuchClass");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("no class named 'NoSuchClass'"));
  r = torchpatch_cli("verify --help");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("--rtol"));
}

TEST_CASE("cli verify on a preset builds both models from the same weights", "[cli][verify]") {
  // The fused projections would get other random values from the preset's seed; verify saves the
  // original and loads both from that, so they agree.
  const auto r = torchpatch_cli("verify --preset tiny-qwen2 --patch Qwen2Attention=FusedQKVAttention --repeat 1");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("Qwen2ForCausalLM from preset tiny-qwen2: 2 patch points replaced"));
  CHECK_THAT(r.out, Contains("PASS"));
}

TEST_CASE("cli run on BERT writes last_hidden_state, pooler_output and, for the masked-LM head, logits", "[cli][bert]") {
  const auto dir = data_dir() / "bert_model";
  const auto out = temp_file("bert.safetensors");
  auto r = torchpatch_cli("run --model " + dir.string() + " --inputs " + (dir / "reference.safetensors").string() +
                          " --output " + out.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("last_hidden_state [2, 12, 64]"));
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(dir / "reference.safetensors");
  {
    const auto written = torchpatch::checkpoint::SafetensorsFile::open(out);
    CHECK_FALSE(written->find("logits"));
    CHECK(close("last_hidden_state", written->tensor("last_hidden_state"), ref->tensor("last_hidden_state"),
                ref->tensor("attention_mask")));
    CHECK(close("pooler_output", written->tensor("pooler_output"), ref->tensor("pooler_output")));
  }

  // A masked-LM checkpoint (the base weights under `bert.`, a head) writes logits too, and no pooler.
  torchpatch::PretrainedOptions options;
  options.strict = false;
  options.config_overrides = {{"architectures", {"BertForMaskedLM"}}};
  const auto mlm_dir = temp_file("bert-mlm");
  torchpatch::checkpoint::save_pretrained(*torchpatch::from_pretrained(dir, options), mlm_dir);
  r = torchpatch_cli("run --model " + mlm_dir.string() + " --inputs " + (dir / "reference.safetensors").string() +
                     " --output " + out.string() + " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto json = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(json["model"] == "BertForMaskedLM");
  CHECK(json["shapes"]["logits"] == std::vector<int64_t>{2, 12, 256});
  const auto written = torchpatch::checkpoint::SafetensorsFile::open(out);
  CHECK(written->find("logits"));
  CHECK_FALSE(written->find("pooler_output"));
  CHECK(close("mlm last_hidden_state", written->tensor("last_hidden_state"), ref->tensor("last_hidden_state"),
              ref->tensor("attention_mask")));
  std::filesystem::remove_all(mlm_dir);
  std::filesystem::remove(out);
}
