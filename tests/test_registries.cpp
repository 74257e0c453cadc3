// Registries of one's own share nothing with the process-wide ones or with each other: patches,
// output recorders, weight conversions and plugin families each stay where they were registered.
#include "test_prelude.h"

#include <algorithm>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/runtime/loader.h"
#include "torchpatch/runtime/registries.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

std::string class_at(const PretrainedModel& model, const std::string& path) {
  for (const auto& point : model.patch_points()) {
    if (point.path == path) return point.module->patch_record().class_name;
  }
  return "(none)";
}

bool has_key(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& key) {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == key; });
}

const std::filesystem::path toy_plugin =
    std::filesystem::path(TORCHPATCH_TEST_PLUGIN_DIR) / "toy_family" / "testplugin_toy_family.so";

}  // namespace

TEST_CASE("a patch registered in one Registries applies only to models built from it", "[registries]") {
  Registries mine, theirs;
  auto marked = *mine.classes().find("LlamaAttention");
  marked.name = "MarkedLlamaAttention";
  mine.patches().register_patch_mapping({{"LlamaAttention", marked}});

  const auto config = preset_config("tiny-llama", mine);
  CHECK(class_at(*from_config(config, mine), "model.layers.0.self_attn") == "MarkedLlamaAttention");
  CHECK(class_at(*from_config(config, theirs), "model.layers.0.self_attn") == "LlamaAttention");
  CHECK(class_at(*from_config(config), "model.layers.0.self_attn") == "LlamaAttention");
  CHECK(!get_patch_mapping().contains("LlamaAttention"));

  // load_model reports the plan and unmatched keys against the registries it was given.
  mine.patches().register_patch_mapping({{"LlamaAtention", marked}});
  LoadModelOptions options;
  options.pretrained.registries = mine;
  ModelSource source;
  source.preset = "tiny-llama";
  const auto loaded = load_model(source, options);
  REQUIRE(loaded.unmatched.size() == 1);
  CHECK(loaded.unmatched[0].key == "LlamaAtention");
  CHECK(loaded.unmatched[0].suggestion == "did you mean 'LlamaAttention'?");
}

TEST_CASE("output recorders and conversions stay in their Registries", "[registries]") {
  Registries mine, theirs;
  mine.recorders().add("LlamaForCausalLM", "attention_output", {"LlamaAttention", 0, ""});
  mine.conversions().add("LlamaForCausalLM", checkpoint::ConversionRules{checkpoint::WeightRenaming{"final_norm", "model.norm"}});

  const auto config = preset_config("tiny-llama");
  auto ours = from_config(config, mine), other = from_config(config, theirs);
  ModelInputs in;
  in.input_ids = at::tensor({1, 2, 3}, at::kLong).unsqueeze(0);
  in.outputs = {"attention_output"};
  const auto out = ours->forward(in);
  CHECK(out.captured.at("attention_output").size() == static_cast<std::size_t>(config.decoder.num_hidden_layers));
  CHECK_THROWS_WITH(other->forward(in), Contains("LlamaForCausalLM has no recorder by that name"));
  CHECK(output_recorders("LlamaForCausalLM").count("attention_output") == 0);

  const auto renamed = checkpoint::hub_state_dict(*ours, mine.conversions());
  CHECK(has_key(renamed, "final_norm.weight"));
  CHECK(!has_key(renamed, "model.norm.weight"));
  CHECK(has_key(checkpoint::hub_state_dict(*other, theirs.conversions()), "model.norm.weight"));
  CHECK(has_key(checkpoint::hub_state_dict(*ours), "model.norm.weight"));  // the process-wide rules
}

TEST_CASE("two plugin hosts with their own Registries each get a plugin's family", "[registries][plugins][family]") {
  Registries first, second;
  PluginHost a(PluginHostOptions{/*strict=*/true}, first);
  PluginHost b(PluginHostOptions{/*strict=*/true}, second);
  CHECK(a.load_file(toy_plugin).status == PluginRecord::Status::Loaded);
  CHECK(b.load_file(toy_plugin).status == PluginRecord::Status::Loaded);  // same library, other registries
  CHECK(first.families().find("toy"));
  CHECK(second.families().find("toy"));
  CHECK(!global_families().find("toy"));
  CHECK_THROWS_WITH(preset_config("tiny-toy"), Contains("unknown preset 'tiny-toy'"));

  const auto model = from_config(preset_config("tiny-toy", first), first);
  CHECK(model->class_name() == "ToyForCausalLM");
  CHECK_THROWS_WITH(construct_model(preset_config("tiny-toy", first)), Contains("model_type 'toy' is not supported"));

  // The same registries again: the plugin is already there, not loaded twice, and this host offers
  // it too; the same host asked again reports a duplicate.
  PluginHost again(PluginHostOptions{}, first);
  const auto record = again.load_file(toy_plugin);
  CHECK(record.status == PluginRecord::Status::Loaded);
  CHECK(record.families == std::vector<std::string>{"toy"});
  CHECK(again.load_file(toy_plugin).status == PluginRecord::Status::Duplicate);
}
