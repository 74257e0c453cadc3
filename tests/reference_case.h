// The shared reference harness: one case of tests/data (a checkpoint, its reference.safetensors and
// manifest.json, computed by Hugging Face transformers) and the checks every family's reference test
// runs on it, as llm.c's tests do: compare with the dump, print the max difference. Floats at atol
// 1e-4 / rtol 1e-4 at real tokens, token ids exactly, saved checkpoints bit for bit.
#pragma once

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_util.h"
#include "test_util.h"
#include "torchpatch/checkpoint/checkpoint.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/models/pretrained.h"

namespace reference {

using namespace torchpatch;
namespace fs = std::filesystem;

/// One case of tests/data: its directory and its reference tensors.
struct Case {
  std::string name;
  fs::path dir;
  std::shared_ptr<checkpoint::SafetensorsFile> ref;
  explicit Case(const std::string& case_name)
      : name(case_name),
        dir(testutil::data_dir() / case_name),
        ref(checkpoint::SafetensorsFile::open(dir / "reference.safetensors")) {}
  at::Tensor get(const std::string& tensor) const { return ref->tensor(tensor); }
};


// The padded batch (input_ids, attention_mask, position_ids) with hidden states, then each row alone.
inline void check_forward(PretrainedModel& model, const Case& c) {
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  in.output_hidden_states = true;
  const auto out = on_host(model.forward(in));
  CHECK(testutil::close(c.name + " logits", out.logits, c.get("logits"), in.attention_mask));
  REQUIRE(static_cast<int64_t>(out.hidden_states.size()) == c.get("hidden_states").size(0));  // layers + 1
  CHECK(testutil::close(c.name + " hidden_states", at::stack(out.hidden_states), c.get("hidden_states"),
                        in.attention_mask.unsqueeze(0)));
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    ModelInputs alone;
    alone.input_ids = c.get(prefix + "input_ids");
    CHECK(testutil::close(c.name + " " + prefix + "logits", model.forward(alone).logits, c.get(prefix + "logits")));
  }
}

// MoE: the padded batch's router outputs of each sparse layer (`layers`, the manifest's moe_layers;
// the family's built-in recorders): router_logits, routing_weights (atol 1e-5) and selected_experts
// exactly, at real tokens.
inline void check_routing(PretrainedModel& model, const Case& c, const std::vector<int64_t>& layers) {
  const auto sparse_layers = static_cast<int64_t>(layers.size());
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  in.outputs = {"router_logits", "routing_weights", "selected_experts"};
  const auto out = on_host(model.forward(in));
  const auto real = in.attention_mask.reshape({-1});
  const auto padding = real.to(at::kBool).logical_not().unsqueeze(-1);
  for (const auto& name : in.outputs) REQUIRE(static_cast<int64_t>(out.captured.at(name).size()) == sparse_layers);
  for (int64_t i = 0; i < sparse_layers; ++i) {
    const auto suffix = "_layer" + std::to_string(layers[i]);
    CHECK(testutil::close(c.name + " router_logits" + suffix, out.captured.at("router_logits")[i],
                          c.get("router_logits" + suffix), real));
    CHECK(testutil::close(c.name + " routing_weights" + suffix, out.captured.at("routing_weights")[i],
                          c.get("routing_weights" + suffix), real, 1e-5, 1e-4));
    INFO(c.name << " selected_experts" << suffix);
    CHECK(at::equal(out.captured.at("selected_experts")[i].masked_fill(padding, -1),
                    c.get("selected_experts" + suffix).masked_fill(padding, -1)));
  }
}

// Greedy, 8 new tokens, never stopping early: what the reference cases ran.
inline GenerationConfig reference_greedy() {
  GenerationConfig config;
  config.max_new_tokens = 8;
  config.output_logits = true;
  return config;
}

// Generates for the padded batch and for each row alone; ids exactly, step logits within 1e-4.
inline void check_generation(PretrainedModel& model, const Case& c) {
  const auto batch = generate(model, c.get("input_ids"), c.get("attention_mask"), reference_greedy());
  CHECK(at::equal(batch.sequences, c.get("generated_ids")));
  REQUIRE(batch.logits.size() == 8);
  CHECK(testutil::close(c.name + " generated_logits", at::stack(batch.logits), c.get("generated_logits")));
  for (int row = 0; row < 2; ++row) {
    const auto prefix = "row" + std::to_string(row) + "_";
    const auto alone = generate(model, c.get(prefix + "input_ids"), {}, reference_greedy());
    INFO(c.name << " row " << row);
    CHECK(at::equal(alone.sequences, c.get(prefix + "generated_ids")));
    REQUIRE(alone.logits.size() == 8);
    CHECK(testutil::close(c.name + " " + prefix + "generated_logits", at::stack(alone.logits),
                          c.get(prefix + "generated_logits")));
  }
}

// torchpatch run (logits, hidden states) and generate (ids, step logits) write the reference outputs.
inline void check_cli(const Case& c) {
  const auto mask = c.get("attention_mask");
  const auto run_out = testutil::temp_file(c.name + "-run.safetensors");
  const auto run = testutil::torchpatch_cli("run --model " + c.dir.string() + " --inputs " +
                                            (c.dir / "reference.safetensors").string() + " --hidden-states --output " +
                                            run_out.string());
  {
    INFO(run.out);
    REQUIRE(run.code == 0);
  }
  const auto ran = checkpoint::SafetensorsFile::open(run_out);
  CHECK(testutil::close(c.name + " cli logits", ran->tensor("logits"), c.get("logits"), mask));
  CHECK(testutil::close(c.name + " cli hidden_states", ran->tensor("hidden_states"), c.get("hidden_states"),
                        mask.unsqueeze(0)));

  const auto inputs = testutil::temp_file(c.name + "-batch-inputs.safetensors");
  checkpoint::save_safetensors(inputs, {{"input_ids", c.get("input_ids")}, {"attention_mask", mask}});
  const auto gen_out = testutil::temp_file(c.name + "-generated.safetensors");
  const auto gen = testutil::torchpatch_cli("generate --model " + c.dir.string() + " --inputs " + inputs.string() +
                                            " --max-new-tokens 8 --ignore-eos --output " + gen_out.string());
  {
    INFO(gen.out);
    REQUIRE(gen.code == 0);
  }
  const auto generated = checkpoint::SafetensorsFile::open(gen_out);
  CHECK(at::equal(generated->tensor("generated_ids"), c.get("generated_ids")));
  const auto logits = generated->tensor("generated_logits");
  CHECK(logits.scalar_type() == at::kFloat);
  CHECK(testutil::close(c.name + " cli generated_logits", logits, c.get("generated_logits")));
  for (const auto& file : {run_out, inputs, gen_out}) fs::remove(file);
}

// save_pretrained writes exactly the case's own checkpoint back: the same keys, every tensor bit for
// bit (dtype, shape and bytes).
inline void check_saves_checkpoint_bit_exactly(const PretrainedModel& model, const Case& c) {
  const auto dir = testutil::temp_file(c.name + "-save");
  fs::remove_all(dir);
  checkpoint::save_pretrained(model, dir);
  const auto original = checkpoint::Checkpoint::open(c.dir / "model.safetensors");
  const auto saved = checkpoint::Checkpoint::open(dir / "model.safetensors");
  CHECK(saved.keys() == original.keys());
  for (const auto& key : original.keys()) {
    INFO(key);
    REQUIRE(saved.contains(key));
    const auto x = saved.tensor(key).contiguous(), y = original.tensor(key).contiguous();
    REQUIRE(x.scalar_type() == y.scalar_type());
    REQUIRE(x.sizes() == y.sizes());
    CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0);
  }
  fs::remove_all(dir);
}

}  // namespace reference
