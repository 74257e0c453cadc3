// Families whose reference cases transformers 5.17 built (tests/data/*_v5: v5's config spelling,
// `rope_parameters` and `layer_types`), on the shared harness (reference_case.h): the padded batch and
// each row, greedy generation, torchpatch run and generate, and the checkpoint saved back bit for bit.
#include "test_prelude.h"
#include "reference_case.h"

#include "torchpatch/moe/routing.h"
#include "torchpatch/runtime/auto.h"

using reference::Case;

namespace {

std::shared_ptr<torchpatch::PretrainedModel> load(const Case& c, const std::string& class_name) {
  auto model = torchpatch::from_pretrained(c.dir);
  REQUIRE(model->class_name() == class_name);
  return model;
}

// The whole reference check of one case: forward, router outputs of `moe_layers` (MoE families),
// generation, save bit for bit, and the CLI.
void check_family(const std::string& name, const std::string& class_name, const std::vector<int64_t>& moe_layers = {}) {
  const Case c(name);
  const auto model = load(c, class_name);
  reference::check_forward(*model, c);
  if (!moe_layers.empty()) reference::check_routing(*model, c, moe_layers);
  reference::check_generation(*model, c);
  reference::check_saves_checkpoint_bit_exactly(*model, c);
  reference::check_cli(c);
}

}  // namespace

TEST_CASE("qwen3_dense_v5: forward, generation, cli and save match the reference", "[qwen3][reference]") {
  check_family("qwen3_dense_v5", "Qwen3ForCausalLM");
}

TEST_CASE("mixtral_basic_v5: forward, routing, generation, cli and save match the reference", "[mixtral][reference]") {
  check_family("mixtral_basic_v5", "MixtralForCausalLM", {0, 1});
}

TEST_CASE("MoE families record and replay routes through their router kind", "[mixtral][olmoe][glm4_moe][deepseek_v3][gpt_oss][cli][moe]") {
  for (const char* name :
       {"mixtral_basic_v5", "olmoe_basic_v5", "glm4_moe_basic_v5", "deepseek_v3_mla_v5", "gpt_oss_basic_v5"}) {
    const Case c(name);
    const auto routes = testutil::temp_file(c.name + "-routes.npy");
    auto r = testutil::torchpatch_cli("routing record --model " + c.dir.string() +
                                      " --prompt-ids 5,6,7,8 --max-new-tokens 4 --out " + routes.string());
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto array = torchpatch::load_npy(routes);
    CHECK(array.sizes() == at::IntArrayRef({7, 2, 2}));  // 4 prompt + 3 fed-back tokens, 2 sparse layers, top-2
    const auto tokens_line = r.out.substr(r.out.find("tokens: ") + 8);
    r = testutil::torchpatch_cli("routing replay --model " + c.dir.string() + " --routes " + routes.string() +
                                 " --ids " + tokens_line.substr(0, tokens_line.find('\n')) + " --json");
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["loss"].get<double>() > 0);
    CHECK(j["router_grad_norm"].get<double>() > 0);
    std::filesystem::remove(routes);
  }
}

TEST_CASE("smollm3_nope_v5: forward, generation, cli and save match the reference", "[smollm3][reference]") {
  check_family("smollm3_nope_v5", "SmolLM3ForCausalLM");
}

TEST_CASE("granite_basic_v5: forward, generation, cli and save match the reference", "[granite][reference]") {
  check_family("granite_basic_v5", "GraniteForCausalLM");
}

TEST_CASE("olmo2_basic_v5: forward, generation, cli and save match the reference", "[olmo2][reference]") {
  check_family("olmo2_basic_v5", "Olmo2ForCausalLM");
}

TEST_CASE("olmoe_basic_v5: forward, routing, generation, cli and save match the reference", "[olmoe][reference]") {
  check_family("olmoe_basic_v5", "OlmoeForCausalLM", {0, 1});
}

TEST_CASE("gemma2_v525: forward, generation, cli and save match the reference", "[gemma2][reference]") {
  check_family("gemma2_v525", "Gemma2ForCausalLM");  // transformers 5.25's oracle (make_oracle_v5.py v5_gemma2)
}

TEST_CASE("gemma3_text_v5: forward, generation, cli and save match the reference", "[gemma3][reference]") {
  check_family("gemma3_text_v5", "Gemma3ForCausalLM");
}

TEST_CASE("glm4_moe_basic_v5: forward, routing, generation, cli and save match the reference", "[glm4_moe][reference]") {
  check_family("glm4_moe_basic_v5", "Glm4MoeForCausalLM", {1, 2});  // layer 0 is dense (first_k_dense_replace 1)
}

TEST_CASE("deepseek_v3_mla_v5: forward, routing, generation, cli and save match the reference", "[deepseek_v3][reference]") {
  check_family("deepseek_v3_mla_v5", "DeepseekV3ForCausalLM", {1, 2});  // layer 0 is dense (first_k_dense_replace 1)
}

TEST_CASE("gpt_oss_basic_v5: forward, routing, generation, cli and save match the reference", "[gpt_oss][reference]") {
  check_family("gpt_oss_basic_v5", "GptOssForCausalLM", {0, 1});
}
