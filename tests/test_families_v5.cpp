// Families whose reference cases transformers 5.17 built (tests/data/*_v5: v5's config spelling,
// `rope_parameters` and `layer_types`), on the shared harness (reference_case.h): the padded batch and
// each row, greedy generation, torchpatch run and generate, and the checkpoint saved back bit for bit.
#include "test_prelude.h"
#include "reference_case.h"

#include "torchpatch/runtime/auto.h"

using reference::Case;

namespace {

std::shared_ptr<torchpatch::PretrainedModel> load(const Case& c, const std::string& class_name) {
  auto model = torchpatch::from_pretrained(c.dir);
  REQUIRE(model->class_name() == class_name);
  return model;
}

}  // namespace

TEST_CASE("qwen3_dense_v5: forward, generation, cli and save match the reference", "[qwen3][reference]") {
  const Case c("qwen3_dense_v5");
  const auto model = load(c, "Qwen3ForCausalLM");
  reference::check_forward(*model, c);
  reference::check_generation(*model, c);
  reference::check_saves_checkpoint_bit_exactly(*model, c);
  reference::check_cli(c);
}
