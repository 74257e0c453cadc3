// The patch registry: Hugging Face's rules (hf-semantics §1) and our deliberate improvements.
#include "test_prelude.h"

#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/patching/scope.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

class TestAttention : public llama::LlamaAttention {
 public:
  using LlamaAttention::LlamaAttention;
};
class OtherAttention : public llama::LlamaAttention {
 public:
  using LlamaAttention::LlamaAttention;
};
class TestMlp : public llama::LlamaMLP {
 public:
  using LlamaMLP::LlamaMLP;
};

ModuleClass test_attention() { return module_class<TestAttention>("TestAttention"); }
ModuleClass other_attention() { return module_class<OtherAttention>("OtherAttention"); }
ModuleClass test_mlp() { return module_class<TestMlp>("TestMlp"); }

std::vector<std::string> keys_of(const PatchMapping& mapping) {
  std::vector<std::string> keys;
  for (const auto& e : mapping.entries()) keys.push_back(e.key);
  return keys;
}

std::string found_class(const PatchMapping& mapping, const std::string& name) {
  auto match = mapping.find(name);
  return match ? match->entry->cls.name : "";
}

}  // namespace

TEST_CASE("register, get (a copy), unregister, clear", "[registry]") {
  PatchRegistry registry;
  registry.register_patch_mapping({{"LlamaAttention", test_attention()}, {"LlamaMLP", test_mlp()}});
  auto copy = registry.get_patch_mapping();
  CHECK(keys_of(copy) == std::vector<std::string>{"LlamaAttention", "LlamaMLP"});
  copy.clear();
  CHECK(registry.get_patch_mapping().size() == 2);  // the copy is independent
  registry.unregister_patch_mapping({"LlamaMLP"});
  CHECK(keys_of(registry.get_patch_mapping()) == std::vector<std::string>{"LlamaAttention"});
  registry.clear_patch_mapping();
  CHECK(registry.get_patch_mapping().empty());
}

TEST_CASE("a duplicate key needs overwrite, which keeps its position", "[registry]") {
  PatchRegistry registry;
  registry.register_patch_mapping({{"LlamaAttention", test_attention()}, {"LlamaMLP", test_mlp()}});
  REQUIRE_THROWS_WITH(registry.register_patch_mapping({{"LlamaAttention", other_attention()}}),
                      "Class 'LlamaAttention' already has a patch mapping registered. Use overwrite=true to "
                      "replace it.");
  registry.register_patch_mapping({{"LlamaAttention", other_attention()}}, /*overwrite=*/true);
  const auto mapping = registry.get_patch_mapping();
  CHECK(keys_of(mapping) == std::vector<std::string>{"LlamaAttention", "LlamaMLP"});
  CHECK(mapping.get("LlamaAttention")->name == "OtherAttention");
}

TEST_CASE("unregistering an unknown key is an error and removes nothing", "[registry]") {
  PatchRegistry registry;
  registry.register_patch_mapping({{"LlamaAttention", test_attention()}});
  REQUIRE_THROWS_WITH(registry.unregister_patch_mapping({"LlamaAttention", "Nope"}),
                      "Class or pattern 'Nope' not found in monkey patch mapping cache. Cannot unregister a class "
                      "that is not registered.");
  CHECK(registry.get_patch_mapping().contains("LlamaAttention"));
}

TEST_CASE("an exact key beats a pattern registered earlier", "[registry][matching]") {
  const PatchMapping mapping({{".*Attention", other_attention()}, {"LlamaAttention", test_attention()}});
  CHECK(found_class(mapping, "LlamaAttention") == "TestAttention");
  CHECK(found_class(mapping, "MistralAttention") == "OtherAttention");
  auto match = mapping.find("LlamaAttention");
  REQUIRE(match);
  CHECK(match->exact);
  CHECK(match->rule() == "exact key");
  CHECK(mapping.find("MistralAttention")->rule() == "pattern '.*Attention'");
}

TEST_CASE("a kind key matches patch points of its kind: after the exact key, before the patterns", "[registry][matching]") {
  const PatchMapping mapping({{".*Attention", other_attention()}, {"{attention}", test_attention()}});
  // Only a patch point of that kind: the kind comes from the built-in class (ModuleClass::kind).
  auto by_kind = mapping.find("MistralAttention", "", "attention");
  REQUIRE(by_kind);
  CHECK(by_kind->entry->cls.name == "TestAttention");
  CHECK(by_kind->by_kind);
  CHECK(by_kind->rule() == "kind key '{attention}'");
  CHECK(mapping.find("Qwen3Attention", "", "qk_norm_attention")->entry->cls.name == "OtherAttention");  // the pattern
  CHECK(found_class(mapping, "MistralAttention") == "OtherAttention");  // no kind given: patterns only
  const PatchMapping exact({{"{attention}", test_attention()}, {"LlamaAttention", other_attention()}});
  CHECK(exact.find("LlamaAttention", "", "attention")->entry->cls.name == "OtherAttention");
  // A kind key is no regular expression: it never matches a class name as one.
  const PatchMapping alone({{"{experts}", test_attention()}});
  CHECK(found_class(alone, "Qwen2MoeExperts").empty());
  CHECK(found_class(alone, "experts").empty());
  CHECK(PatchMapping::is_kind_key("{grouped_router}"));
  CHECK_FALSE(PatchMapping::is_kind_key("{Experts}"));
  CHECK_FALSE(PatchMapping::is_kind_key("{}"));
}

TEST_CASE("a kind key replaces that block in every family whatever it is called", "[registry][matching]") {
  // Llama's and Mistral's attention are both the plain grouped-query kind.
  ScopedPatchMapping patch({{"{attention}", test_attention()}});
  for (const char* preset : {"tiny-llama", "tiny-mistral", "tiny-granite"}) {
    INFO(preset);
    const auto model = preset_model(preset, 1);
    int replaced = 0;
    for (const auto& point : model->patch_points()) {
      if (point.module->patch_record().class_name == "TestAttention") {
        CHECK(point.module->patch_record().rule == "kind key '{attention}'");
        ++replaced;
      }
    }
    CHECK(replaced == 2);  // both layers
  }
  // Qwen3's attention is another kind (per-head q/k norm): untouched.
  const auto qwen3 = preset_model("tiny-qwen3", 1);
  for (const auto& point : qwen3->patch_points()) CHECK(point.module->patch_record().class_name != "TestAttention");
}

TEST_CASE("patterns search unanchored and anchors restrict", "[registry][matching]") {
  const PatchMapping mapping({{"Attention", test_attention()}});
  CHECK(found_class(mapping, "LlamaAttention") == "TestAttention");
  CHECK(found_class(mapping, "AttentionInterface") == "TestAttention");  // search, as Python's re.search
  const PatchMapping anchored({{"^Llama.*Attention$", test_attention()}});
  CHECK(found_class(anchored, "LlamaAttention") == "TestAttention");
  CHECK(found_class(anchored, "LlamaAttentionX").empty());
  CHECK(found_class(anchored, "MistralAttention").empty());
  const PatchMapping plain({{"LlamaAttention", test_attention()}});
  CHECK(found_class(plain, "LlamaAttentionX") == "TestAttention");  // a plain name is a pattern too
  CHECK(found_class(plain, "llamaattention").empty());               // case-sensitive
}

TEST_CASE("the first registered matching pattern wins", "[registry][matching]") {
  const PatchMapping mapping({{"Llama.*", test_attention()}, {".*Attention", other_attention()}});
  CHECK(found_class(mapping, "LlamaAttention") == "TestAttention");
  const PatchMapping reversed({{".*Attention", other_attention()}, {"Llama.*", test_attention()}});
  CHECK(found_class(reversed, "LlamaAttention") == "OtherAttention");
}

TEST_CASE("an invalid regex is rejected at registration, and nothing is registered", "[registry]") {
  PatchRegistry registry;
  REQUIRE_THROWS_WITH(registry.register_patch_mapping({{"LlamaMLP", test_mlp()}, {"Llama(Attention", test_attention()}}),
                      Contains("Invalid regex pattern 'Llama(Attention'"));
  CHECK(registry.get_patch_mapping().empty());  // all or nothing: LlamaMLP was not kept
}

TEST_CASE("a failing entry leaves earlier entries of the same call unregistered", "[registry]") {
  PatchRegistry registry;
  registry.register_patch_mapping({{"LlamaMLP", test_mlp()}});
  REQUIRE_THROWS(registry.register_patch_mapping({{"LlamaAttention", test_attention()}, {"LlamaMLP", test_mlp()}}));
  CHECK(keys_of(registry.get_patch_mapping()) == std::vector<std::string>{"LlamaMLP"});
}

TEST_CASE("a replacement must be a class: a null factory is an error", "[registry]") {
  PatchRegistry registry;
  ModuleClass empty;
  empty.name = "Nothing";
  empty.role = "Attention";
  REQUIRE_THROWS_WITH(registry.register_patch_mapping({{"LlamaAttention", empty}}),
                      Contains("Replacement for 'LlamaAttention' must be a class"));
}

TEST_CASE("a class of the wrong role for an exact patch-point key is rejected at registration", "[registry][roles]") {
  PatchRegistry registry;
  REQUIRE_THROWS_WITH(registry.register_patch_mapping({{"LlamaMLP", test_attention()}}),
                      "Replacement class 'TestAttention' for 'LlamaMLP' has role Attention, but 'LlamaMLP' is a patch "
                      "point of role Mlp");
}

TEST_CASE("a pattern that hits a patch point of another role fails the build with a narrower pattern", "[roles]") {
  ApplyPatches scope(PatchMapping({{"Llama(Attention|MLP)", test_attention()}}));
  REQUIRE_THROWS_WITH(construct_model(preset_config("tiny-llama")),
                      "patch point 'LlamaMLP' at model.layers.0.mlp needs role Mlp, but pattern "
                      "'Llama(Attention|MLP)' maps it to 'TestAttention' of role Attention; use a narrower pattern "
                      "such as '.*Attention$'");
}

TEST_CASE("built modules remember key, class, rule and origin", "[build]") {
  ModuleClass cls = test_attention();
  cls.origin = Origin{"my-plugin", "2.1.0", "/plugins/my.so"};
  ApplyPatches scope(PatchMapping({{"LlamaAttention", cls}}));
  auto model = construct_model(preset_config("tiny-llama"));
  int replaced = 0;
  for (const auto& point : model->patch_points()) {
    const auto& r = point.module->patch_record();
    if (r.key == "LlamaAttention") {
      ++replaced;
      CHECK(r.class_name == "TestAttention");
      CHECK(r.rule == "exact key");
      CHECK(r.origin.describe() == "plugin my-plugin 2.1.0 (/plugins/my.so)");
      CHECK(dynamic_cast<TestAttention*>(point.module.get()) != nullptr);
    } else {
      CHECK(r.rule == "builtin");
      CHECK(r.class_name == r.key);
      CHECK(r.origin.builtin());
    }
  }
  CHECK(replaced == 2);
}

TEST_CASE("patch points of a Llama model, in tree order", "[build]") {
  auto model = construct_model(preset_config("tiny-llama"));
  std::vector<std::string> seen;
  int projections = 0;  // every Linear is a patch point too (test_linear_patch_point.cpp)
  for (const auto& p : model->patch_points()) {
    if (p.module->patch_record().key == "Linear") ++projections;
    else seen.push_back(p.path + "=" + p.module->patch_record().key);
  }
  CHECK(projections == 2 * 7 + 1);
  CHECK(seen == std::vector<std::string>{
                    "model=LlamaModel", "model.layers.0=LlamaDecoderLayer", "model.layers.0.self_attn=LlamaAttention",
                    "model.layers.0.mlp=LlamaMLP", "model.layers.0.input_layernorm=LlamaRMSNorm",
                    "model.layers.0.post_attention_layernorm=LlamaRMSNorm", "model.layers.1=LlamaDecoderLayer",
                    "model.layers.1.self_attn=LlamaAttention", "model.layers.1.mlp=LlamaMLP",
                    "model.layers.1.input_layernorm=LlamaRMSNorm",
                    "model.layers.1.post_attention_layernorm=LlamaRMSNorm", "model.norm=LlamaRMSNorm"});
  // State-dict keys are Hugging Face's.
  std::vector<std::string> keys;
  for (const auto& p : model->named_parameters()) keys.push_back(p.key());
  CHECK(keys.front() == "model.embed_tokens.weight");
  CHECK(std::find(keys.begin(), keys.end(), "model.layers.1.self_attn.k_proj.weight") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "model.layers.0.post_attention_layernorm.weight") != keys.end());
  CHECK(keys.back() == "lm_head.weight");
  CHECK(keys.size() == 1 + 2 * 9 + 1 + 1);
}
