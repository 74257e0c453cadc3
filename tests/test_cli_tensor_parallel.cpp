// The CLI as ranks of one group (the variables torchrun sets): every decoder reference case split over
// two processes matches the reference, the MoE cases' expert choices exactly; four ranks replicate
// key/value heads; a world size that does not split the heads is an error before any weight is read.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include "torchpatch/checkpoint/checkpoint.h"

using Catch::Matchers::Contains;
using namespace testutil;

namespace {

std::vector<Result> run_cli_group(int world, const std::string& arguments) {
  return run_group(world, TORCHPATCH_CLI, arguments);
}

// run --inputs reference.safetensors over `world` ranks; rank 0's --output against the reference.
void check_case(const std::string& name, int world) {
  const auto dir = (data_dir() / name).string();
  const auto out = temp_file(name + "-tp.safetensors");
  const bool moe = name.find("moe") != std::string::npos;
  const auto ranks = run_cli_group(world, "run --model " + dir + " --inputs " + dir + "/reference.safetensors " +
                                              "--hidden-states --output " + out.string() +
                                              (moe ? " --router-outputs" : ""));
  for (int rank = 0; rank < world; ++rank) {
    INFO(name << " rank " << rank << ":\n" << ranks[rank].out);
    REQUIRE(ranks[rank].code == 0);
    // Rank 0 reports; the others print nothing of the result.
    CHECK((ranks[rank].out.find("next tokens at position") != std::string::npos) == (rank == 0));
  }
  CHECK_THAT(ranks[0].out, Contains("TensorParallel"));  // the counters of the classes that replaced attention and MLPs
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(data_dir() / name / "reference.safetensors");
  const auto got = torchpatch::checkpoint::SafetensorsFile::open(out);
  const auto mask = ref->tensor("attention_mask");
  CHECK(close(name + " tp" + std::to_string(world) + " logits", got->tensor("logits"), ref->tensor("logits"), mask));
  CHECK(close(name + " tp" + std::to_string(world) + " hidden_states", got->tensor("hidden_states"),
              ref->tensor("hidden_states"), mask.unsqueeze(0)));
  if (moe) {
    const auto keep = mask.reshape({-1}).unsqueeze(-1).to(at::kBool).logical_not();
    for (const char* layer : {"selected_experts_layer0", "selected_experts_layer1"}) {
      INFO(name << " " << layer);
      CHECK(at::equal(got->tensor(layer).masked_fill(keep, -1), ref->tensor(layer).masked_fill(keep, -1)));
    }
  }
  std::filesystem::remove(out);
}

}  // namespace

TEST_CASE("two ranks match the reference on every decoder case, MoE expert choices exactly", "[cli][dist]") {
  for (const char* name : {"llama_basic", "mistral_sliding_window", "gemma_basic", "qwen2_moe_basic", "qwen3_moe_basic"}) {
    check_case(name, 2);
  }
}

TEST_CASE("four ranks (key/value heads replicated over two ranks each) match the reference", "[cli][dist]") {
  check_case("llama_basic", 4);
}

TEST_CASE("a world size that does not split the heads fails on every rank before reading weights", "[cli][dist]") {
  const auto ranks = run_cli_group(3, "run --model " + llama_dir() + " --prompt-ids 1,2,3");
  for (const auto& rank : ranks) {
    INFO(rank.out);
    CHECK(rank.code == 1);
    CHECK_THAT(rank.out, Contains("model.layers.0.self_attn: 4 attention heads and 2 key/value heads do not split "
                                  "over 3 ranks"));
  }
}
