// The MoE plugins (sequential-experts, replayable-router), routing record and replay, .npy files,
// and the routing / --router-outputs CLI.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <fstream>

#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/moe/routing.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

PluginHost& bundled() {
  static PluginHost host;
  static const bool loaded = (host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue), true);
  (void)loaded;
  return host;
}

ModuleClass bundled_class(const std::string& name) {
  auto cls = bundled().find_class(name);
  REQUIRE(cls);
  return *cls;
}

std::shared_ptr<PretrainedModel> load(const std::string& case_name) {
  return from_pretrained(testutil::data_dir() / case_name);
}

at::Tensor reference(const std::string& case_name, const std::string& tensor) {
  return checkpoint::SafetensorsFile::open(testutil::data_dir() / case_name / "reference.safetensors")->tensor(tensor);
}

// save_pretrained writes exactly the case's own checkpoint back: the same keys, every tensor equal.
void check_saves_hub_layout(const PretrainedModel& model, const std::string& case_name, const std::string& label) {
  const auto dir = testutil::temp_file(case_name + "-" + label + "-save");
  checkpoint::save_pretrained(model, dir);
  const auto original = checkpoint::Checkpoint::open(testutil::data_dir() / case_name);
  const auto saved = checkpoint::Checkpoint::open(dir);
  CHECK(saved.keys() == original.keys());
  for (const auto& k : original.keys()) CHECK(at::equal(saved.tensor(k), original.tensor(k)));
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("SequentialExperts loads the per-expert hub layout and matches the reference", "[moe][plugins]") {
  // Under the kind key {experts}: every family's experts, whatever the family calls them and its hub
  // names their projections (Mixtral: block_sparse_moe.experts.N.w1/w3/w2).
  for (const auto& [case_name, block] : {std::pair<std::string, std::string>{"qwen2_moe_basic", "mlp"},
                                         {"qwen3_moe_basic", "mlp"},
                                         {"mixtral_basic_v5", "block_sparse_moe"},
                                         {"olmoe_basic_v5", "mlp"}}) {
    INFO(case_name);
    ScopedPatchMapping patch({{"{experts}", bundled_class("SequentialExperts")}});
    checkpoint::LoadReport report;
    auto model = from_pretrained(testutil::data_dir() / case_name, {}, &report);
    CHECK(report.clean());
    const auto params = model->named_parameters();
    CHECK(params.contains("model.layers.0." + block + ".experts.7.down_proj.weight"));
    CHECK_FALSE(params.contains("model.layers.0." + block + ".experts.gate_up_proj"));
    const auto points = model->patch_points();
    const std::string experts_path = "model.layers.0." + block + ".experts";  // clang: no binding in a lambda
    const auto experts = std::find_if(points.begin(), points.end(),
                                      [&experts_path](const PatchPoint& p) { return p.path == experts_path; });
    REQUIRE(experts != points.end());
    CHECK(experts->module->patch_record().rule == "kind key '{experts}'");
    at::NoGradGuard no_grad;
    ModelInputs in;
    in.input_ids = reference(case_name, "input_ids");
    in.attention_mask = reference(case_name, "attention_mask");
    in.position_ids = reference(case_name, "position_ids");
    in.outputs = {"selected_experts"};
    const auto out = model->forward(in);
    CHECK(testutil::close(case_name + " SequentialExperts logits", out.logits, reference(case_name, "logits"),
                          in.attention_mask));
    const auto keep = in.attention_mask.reshape({-1, 1}).to(at::kBool);
    for (int layer = 0; layer < 2; ++layer) {
      const auto expected = reference(case_name, "selected_experts_layer" + std::to_string(layer));
      CHECK(at::equal(out.captured.at("selected_experts")[layer].masked_fill(keep.logical_not(), -1),
                      expected.masked_fill(keep.logical_not(), -1)));
    }
    GenerationConfig greedy;
    greedy.max_new_tokens = 8;
    CHECK(at::equal(generate(*model, in.input_ids, in.attention_mask, greedy).sequences,
                    reference(case_name, "generated_ids")));
    check_saves_hub_layout(*model, case_name, "sequential");  // the per-expert layout, bit for bit
  }
}

TEST_CASE("replay: record during generation, change the router, replay the same experts", "[moe][replay]") {
  ScopedPatchMapping patch({{"Qwen2MoeTopKRouter", bundled_class("ReplayableTopKRouter")}});
  auto model = load("qwen2_moe_basic");
  const auto prompt = reference("qwen2_moe_basic", "row0_input_ids");

  // Record: the experts of every token that went through the model while generating.
  GenerationConfig config;
  config.max_new_tokens = 6;
  config.outputs = {"selected_experts"};
  const auto generated = generate(*model, prompt, {}, config);
  std::vector<at::Tensor> routes(2);
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<at::Tensor> steps;
    for (const auto& step : generated.captured) steps.push_back(step.at("selected_experts")[layer]);
    routes[layer] = at::cat(steps, 0);
  }
  const auto sequence = generated.sequences.narrow(1, 0, routes[0].size(0));
  ModelInputs in;
  in.input_ids = sequence;
  in.labels = sequence;
  in.outputs = {"selected_experts"};
  const double recorded_loss = [&] {
    at::NoGradGuard no_grad;
    return model->forward(in).loss.item<double>();
  }();

  // Change the routers: on their own they would now choose differently.
  {
    at::NoGradGuard no_grad;
    for (auto& router : moe_routers(*model)) {
      for (auto& p : router->parameters()) p.add_(at::randn(p.sizes(), at::make_generator<at::CPUGeneratorImpl>(5)));
    }
  }
  const auto free_choice = [&] {
    at::NoGradGuard no_grad;
    return model->forward(in).captured.at("selected_experts");
  }();
  CHECK_FALSE(at::equal(free_choice[0], routes[0]));

  {
    ReplayMoeRouting guard(*model, routes);
    const auto out = model->forward(in);
    for (int layer = 0; layer < 2; ++layer) CHECK(at::equal(out.captured.at("selected_experts")[layer], routes[layer]));
    std::cout << "replayed loss " << out.loss.item<double>() << " vs recorded " << recorded_loss << "\n";
    CHECK(std::abs(out.loss.item<double>() - recorded_loss) > 1e-4);
    out.loss.backward();
    for (auto& router : moe_routers(*model)) {
      CHECK(router->parameters()[0].grad().abs().sum().item<double>() > 0);
    }
  }
  // The guard is gone: routing is free again.
  at::NoGradGuard no_grad;
  CHECK(at::equal(model->forward(in).captured.at("selected_experts")[0], free_choice[0]));
}

TEST_CASE("replay: wrong router count, shapes, ids and plain routers are clear errors", "[moe][replay][errors]") {
  auto plain = load("qwen2_moe_basic");
  const auto routes = std::vector<at::Tensor>{at::zeros({4, 2}, at::kLong), at::zeros({4, 2}, at::kLong)};
  REQUIRE_THROWS_WITH(ReplayMoeRouting(*plain, routes), Contains("router Qwen2MoeTopKRouter at model.layers.0.mlp.gate "
                                                                 "cannot replay routes"));
  ScopedPatchMapping patch({{"Qwen2MoeTopKRouter", bundled_class("ReplayableTopKRouter")}});
  auto model = load("qwen2_moe_basic");
  REQUIRE_THROWS_WITH(ReplayMoeRouting(*model, {routes[0]}), Contains("has 2 routers but 1 route tensors were given"));
  REQUIRE_THROWS_WITH(ReplayMoeRouting(*model, {routes[0], at::zeros({4, 3}, at::kLong)}),
                      Contains("routes of router 1 (model.layers.1.mlp.gate) must be [tokens, 2] (top_k), got 4x3"));
  REQUIRE_THROWS_WITH(ReplayMoeRouting(*model, {routes[0], at::full({4, 2}, 8, at::kLong)}),
                      Contains("hold an expert id outside 0..7"));
  ReplayMoeRouting guard(*model, routes);
  ModelInputs in;
  in.input_ids = at::ones({1, 5}, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("replay: router at model.layers.0.mlp.gate got 5 tokens, the routes have 4"));
}

TEST_CASE("routes convert to vLLM's array and round-trip through .npy", "[moe][npy]") {
  const std::vector<at::Tensor> per_layer{at::tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}).view({3, 2}),
                                          at::tensor(std::vector<int64_t>{7, 0, 6, 1, 5, 2}).view({3, 2})};
  const auto array = routes_to_array(per_layer);
  CHECK(array.sizes() == at::IntArrayRef({3, 2, 2}));
  CHECK(array.scalar_type() == at::kInt);
  CHECK(array[1][1][0].item<int>() == 6);
  const auto file = testutil::temp_file("routes.npy");
  save_npy(file, array);
  // The header numpy expects: magic, version 1.0, a 64-byte aligned dict.
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  const auto header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  CHECK((10 + header_len) % 64 == 0);
  CHECK_THAT(bytes.substr(10, header_len), Contains("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2, 2), }"));
  CHECK(bytes.size() == 10 + header_len + 12 * 4);
  const auto back = routes_from_array(load_npy(file));
  REQUIRE(back.size() == 2);
  CHECK(at::equal(back[1], per_layer[1]));
  std::ofstream(file, std::ios::binary) << "not numpy";
  REQUIRE_THROWS_WITH(load_npy(file), Contains("not a readable .npy file: no \\x93NUMPY magic"));
  std::filesystem::remove(file);
  REQUIRE_THROWS_WITH(routes_from_array(at::zeros({3, 2})), Contains("expected [tokens, layers, top_k], got 2 dims"));
  // Empty, but claiming a huge dimension: refused before any view of it overflows.
  REQUIRE_THROWS_WITH(routes_from_array(at::empty({int64_t{1} << 40, 2, 0}, at::kLong)), Contains("has a dimension above 2^31"));
}

TEST_CASE("cli routing record and replay, and run --router-outputs", "[cli][moe]") {
  const auto dir = (testutil::data_dir() / "qwen2_moe_basic").string();
  const auto routes = testutil::temp_file("cli-routes.npy");
  auto r = testutil::torchpatch_cli("routing record --model " + dir + " --prompt-ids 5,6,7,8 --max-new-tokens 4 --out " +
                                    routes.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto array = load_npy(routes);
  CHECK(array.sizes() == at::IntArrayRef({7, 2, 2}));  // 4 prompt + 3 fed-back tokens, 2 layers, top-2
  CHECK(array.scalar_type() == at::kInt);
  const auto tokens_line = r.out.substr(r.out.find("tokens: ") + 8);
  const auto ids = tokens_line.substr(0, tokens_line.find('\n'));
  r = testutil::torchpatch_cli("routing replay --model " + dir + " --routes " + routes.string() + " --ids " + ids +
                               " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["loss"].get<double>() > 0);
  CHECK(j["router_grad_norm"].get<double>() > 0);
  r = testutil::torchpatch_cli("routing replay --model " + dir + " --routes " + routes.string() + " --ids 1,2,3");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("got 3 tokens, the routes have 7"));
  r = testutil::torchpatch_cli("routing replay --model " + dir + " --ids 1,2,3");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--routes is required"));
  r = testutil::torchpatch_cli("routing record --preset tiny-llama --prompt-ids 1,2 --out " + routes.string());
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("LlamaForCausalLM has no MoE layers"));
  std::filesystem::remove(routes);

  const auto out = testutil::temp_file("router-outputs.safetensors");
  r = testutil::torchpatch_cli("run --model " + dir + " --inputs " + dir + "/reference.safetensors --router-outputs "
                               "--experts eager --output " + out.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto file = checkpoint::SafetensorsFile::open(out);
  const auto mask = reference("qwen2_moe_basic", "attention_mask").reshape({-1});
  for (const char* name : {"router_logits_layer1", "routing_weights_layer0"}) {
    CHECK(testutil::close(name, file->tensor(name), reference("qwen2_moe_basic", name), mask, 1e-5, 1e-4));
  }
  const auto keep = mask.unsqueeze(-1).to(at::kBool).logical_not();
  CHECK(at::equal(file->tensor("selected_experts_layer1").masked_fill(keep, -1),
                  reference("qwen2_moe_basic", "selected_experts_layer1").masked_fill(keep, -1)));
  std::filesystem::remove(out);
}

TEST_CASE("default experts save back to the per-expert hub layout bit-exactly, and replayable routers match the reference when free", "[moe][plugins][conversion]") {
  for (const std::string case_name : {"qwen2_moe_basic", "qwen3_moe_basic"}) {
    check_saves_hub_layout(*load(case_name), case_name, "fused");
  }
  ScopedPatchMapping patch({{"Qwen3MoeTopKRouter", bundled_class("ReplayableTopKRouter")}});
  auto model = load("qwen3_moe_basic");
  ModelInputs in;
  in.input_ids = reference("qwen3_moe_basic", "input_ids");
  in.attention_mask = reference("qwen3_moe_basic", "attention_mask");
  in.position_ids = reference("qwen3_moe_basic", "position_ids");
  at::NoGradGuard no_grad;
  CHECK(testutil::close("qwen3_moe with ReplayableTopKRouter", model->forward(in).logits,
                        reference("qwen3_moe_basic", "logits"), in.attention_mask));
}
