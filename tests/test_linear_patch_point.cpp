// Every projection of every family is built through the "Linear" patch point, and patch rules can be
// limited by module path (include / exclude globs), as quantizers' modules_to_not_convert select.
#include "test_prelude.h"
#include "test_util.h"

#include <set>

#include "torchpatch/error.h"
#include "torchpatch/models/decoder.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/runtime/auto.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

// nn::Linear under another name, so a test sees where the mapping put it.
class MarkedLinear : public nn::Linear {
 public:
  explicit MarkedLinear(const BuildContext& ctx)
      : nn::Linear(ctx.arg("in_features", 0), ctx.arg("out_features", 0), ctx.flag("bias", false)) {}
};

ModuleClass marked(std::vector<std::string> include = {}, std::vector<std::string> exclude = {}) {
  return with_paths(module_class<MarkedLinear>("MarkedLinear"), std::move(include), std::move(exclude));
}

// Paths of the model's Linear patch points, by the class each became.
std::map<std::string, std::set<std::string>> linear_points(const PretrainedModel& model) {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& point : model.patch_points()) {
    const auto& r = point.module->patch_record();
    if (r.key == "Linear") out[r.class_name].insert(point.path);
  }
  return out;
}

std::shared_ptr<PretrainedModel> tiny(const std::string& preset, const PatchMapping::Items& items = {}) {
  ApplyPatches scope{PatchMapping(items)};
  return preset_model(preset, 0);
}

// A reference case's checkpoint, built with `items`.
std::shared_ptr<PretrainedModel> reference_case(const std::string& name, const PatchMapping::Items& items = {}) {
  ApplyPatches scope{PatchMapping(items)};
  return from_pretrained(testutil::data_dir() / name);
}

}  // namespace

TEST_CASE("PathFilter: globs match the whole path or a dotted suffix of it", "[linear][paths]") {
  const PathFilter keep_head{{}, {"lm_head", "*.mlp.gate"}};
  CHECK_FALSE(keep_head.admits("lm_head"));
  CHECK_FALSE(keep_head.admits("model.layers.3.mlp.gate"));
  CHECK(keep_head.admits("model.layers.3.mlp.gate_proj"));
  CHECK(keep_head.admits("model.lm_headx"));
  CHECK(keep_head.why_not("model.layers.0.mlp.gate") == "excludes it by '*.mlp.gate'");

  const PathFilter only_mlp{{"mlp.*_proj"}, {"layers.0.*"}};
  CHECK(only_mlp.admits("model.layers.1.mlp.down_proj"));
  CHECK_FALSE(only_mlp.admits("model.layers.0.mlp.down_proj"));
  CHECK_FALSE(only_mlp.admits("model.layers.1.self_attn.q_proj"));
  CHECK(only_mlp.why_not("model.layers.1.self_attn.q_proj") == "applies only under [mlp.*_proj]");
  CHECK(PathFilter{{"layers.?.self_attn.q_proj"}, {}}.admits("model.layers.7.self_attn.q_proj"));
  CHECK_FALSE(PathFilter{{"layers.?.self_attn.q_proj"}, {}}.admits("model.layers.17.self_attn.q_proj"));
  CHECK(PathFilter{}.admits("anything"));
}

TEST_CASE("every projection of a decoder is a Linear patch point at its module path", "[linear]") {
  const auto model = tiny("tiny-llama");
  const auto points = linear_points(*model);
  REQUIRE(points.size() == 1);
  const auto& paths = points.at("Linear");
  CHECK(paths.size() == 2 * 7 + 1);  // q, k, v, o, gate, up, down per layer, and lm_head
  for (const char* p : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head"}) {
    CHECK(paths.count(p) == 1);
  }
  // The same numbers as before: nn::Linear is the built-in class.
  auto* q = dynamic_cast<nn::Linear*>(model->named_modules()["model.layers.0.self_attn.q_proj"].get());
  REQUIRE(q != nullptr);
  CHECK(q->weight.sizes() == at::IntArrayRef({64, 64}));
}

TEST_CASE("MoE, BERT and fused-attention projections go through the same door", "[linear]") {
  const auto moe = linear_points(*reference_case("qwen2_moe_basic")).at("Linear");
  CHECK(moe.count("model.layers.0.mlp.shared_expert.gate_proj") == 1);
  CHECK(moe.count("model.layers.0.mlp.shared_expert_gate") == 1);
  PretrainedOptions masked_lm;
  masked_lm.config_overrides = {{"architectures", {"BertForMaskedLM"}}};
  const auto bert = linear_points(*preset_model("tiny-bert", 0, masked_lm)).at("Linear");
  CHECK(bert.count("bert.encoder.layer.0.attention.self.query") == 1);
  CHECK(bert.count("cls.predictions.transform.dense") == 1);
}

TEST_CASE("a Linear rule limited by module path replaces only what it admits", "[linear][paths]") {
  const auto model = tiny("tiny-llama", {{"Linear", marked({}, {"lm_head", "*.mlp.*"})}});
  const auto points = linear_points(*model);
  CHECK(points.at("MarkedLinear").size() == 2 * 4);
  CHECK(points.at("Linear").count("lm_head") == 1);
  CHECK(points.at("Linear").count("model.layers.1.mlp.up_proj") == 1);
  // The kept ones say why.
  for (const auto& point : model->patch_points()) {
    if (point.path != "lm_head") continue;
    CHECK(point.module->patch_record().passed_over == "rule 'Linear' (MarkedLinear) excludes it by 'lm_head'");
  }
  const auto only_attention = linear_points(*tiny("tiny-llama", {{"Linear", marked({"self_attn.*"})}}));
  CHECK(only_attention.at("MarkedLinear").size() == 2 * 4);
}

TEST_CASE("a rule whose filter passes a module over falls through to the next matching rule", "[linear][paths]") {
  auto other = marked({"lm_head"});
  other.name = "HeadLinear";
  const auto points = linear_points(*tiny("tiny-llama", {{"Linear", marked({}, {"lm_head"})}, {"^Linear$", other}}));
  CHECK(points.at("HeadLinear") == std::set<std::string>{"lm_head"});
  CHECK(points.at("MarkedLinear").size() == 2 * 7);
  CHECK(points.count("Linear") == 0);
}

TEST_CASE("a module path pattern that names no module is refused when registered", "[linear][paths]") {
  PatchRegistry registry;
  CHECK_THROWS_WITH(registry.register_patch_mapping({{"Linear", marked({}, {""})}}),
                    Contains("module path pattern '' names no module"));
  CHECK_THROWS_WITH(registry.register_patch_mapping({{"Linear", marked({"..."})}}),
                    Contains("module path pattern '...' names no module"));
  CHECK(registry.get_patch_mapping().empty());
}

TEST_CASE("a Linear replacement of another role is refused naming the key and path", "[linear]") {
  class NotALinear : public roles::Mlp {
   public:
    explicit NotALinear(const BuildContext&) {}
    at::Tensor forward(const at::Tensor& x) override { return x; }
  };
  auto cls = module_class<NotALinear>("NotALinear");
  ApplyPatches scope{PatchMapping(PatchMapping::Items{{"^Lin", cls}})};
  CHECK_THROWS_WITH(preset_model("tiny-llama", 0), Contains("needs role Linear"));
}

TEST_CASE("SequentialExperts' per-expert projections sit at experts.{e}", "[linear][moe]") {
  static PluginHost host;
  static const bool loaded = (host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue), true);
  (void)loaded;
  const auto cls = host.find_class("SequentialExperts");
  REQUIRE(cls);
  const auto points = linear_points(*reference_case("qwen2_moe_basic", {{"Qwen2MoeExperts", *cls}}));
  CHECK(points.at("Linear").count("model.layers.0.mlp.experts.3.gate_proj") == 1);
  CHECK(points.at("Linear").count("model.layers.1.mlp.experts.0.down_proj") == 1);
}

TEST_CASE("make_linear outside a build names the projection by itself", "[linear]") {
  const auto linear = nn::make_linear("proj", 32, 8, true);
  CHECK(linear->patch_record().path == "proj");
  CHECK(linear->in_features() == 32);
  CHECK(linear->out_features() == 8);
  CHECK(linear->forward(at::ones({2, 32})).sizes() == at::IntArrayRef({2, 8}));
}
