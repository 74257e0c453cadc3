// Expert parallelism through the C++ host API, with real processes: this binary starts copies of
// itself as ranks (the hidden test "[.ep-rank]") on a Qwen2-MoE checkpoint whose experts are most
// of its weights. Each rank must hold exactly its share of the experts and grow by about half the
// memory one process does; sampling with a different seed on each rank must still give every rank
// rank 0's tokens (GenerationConfig::agree_tokens), and without the agreement they differ.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/dist/process_group.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/runtime/auto.h"

using Catch::Matchers::Contains;
using namespace torchpatch;

namespace {

// A field of /proc/self/status in KiB (VmRSS, VmHWM).
int64_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// A Qwen2-MoE checkpoint (random weights) of `experts` experts: with 16, 50 MB of its 56 MB are experts.
std::filesystem::path write_moe_checkpoint(int64_t experts, int64_t hidden, int64_t expert_width) {
  auto json = nlohmann::json::parse(std::ifstream(testutil::data_dir() / "qwen2_moe_basic" / "config.json"));
  json["num_experts"] = experts;
  json["hidden_size"] = hidden;
  json["moe_intermediate_size"] = expert_width;
  json["shared_expert_intermediate_size"] = expert_width;
  json["intermediate_size"] = expert_width;
  json["num_hidden_layers"] = 2;
  json.erase("head_dim");
  const auto dir = testutil::temp_file(fmt::format("ep-qwen2-moe-{}x{}", experts, expert_width));
  std::filesystem::remove_all(dir);
  at::manual_seed(0);
  checkpoint::save_pretrained(*from_config(ModelConfig::from_json(json, "ep test config")), dir);
  return dir;
}

std::vector<testutil::Result> run_ranks(int world, const std::filesystem::path& model, const std::string& env = "") {
  return testutil::run_group(world, std::filesystem::read_symlink("/proc/self/exe").string(), "'[.ep-rank]'",
                             "TORCHPATCH_TEST_EP_MODEL='" + model.string() + "' " + env);
}

// "key=value" fields of the line a rank printed.
std::map<std::string, std::string> report_of(const testutil::Result& rank) {
  const auto at = rank.out.find("ep rank:");
  REQUIRE(at != std::string::npos);
  std::istringstream line(rank.out.substr(at + 8, rank.out.find('\n', at) - at - 8));
  std::map<std::string, std::string> fields;
  for (std::string field; line >> field;) {
    const auto eq = field.find('=');
    fields[field.substr(0, eq)] = field.substr(eq + 1);
  }
  return fields;
}

}  // namespace

// One rank: joins the group of the launcher variables (none for one process), builds the model with
// the expert-parallel classes, reports its parameter bytes and memory growth, then samples with
// seed 1000 + rank (TORCHPATCH_TEST_EP_AGREE=1: taking rank 0's tokens).
TEST_CASE("expert-parallel rank", "[.ep-rank]") {
  const char* model_dir = std::getenv("TORCHPATCH_TEST_EP_MODEL");
  REQUIRE(model_dir);
  std::shared_ptr<dist::ProcessGroup> group;
  if (const auto options = dist::options_from_environment(); options && options->world_size > 1) {
    group = dist::ProcessGroup::join(*options);
  }
  const dist::ActiveGroup active(group);
  static PluginHost host;
  host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue);
  const auto cls = [&](const std::string& name) {
    auto found = host.find_class(name);
    REQUIRE(found);
    return *found;
  };
  const ScopedPatchMapping parallel({{"Qwen2MoeAttention", cls("TensorParallelAttention")},
                                     {"Qwen2MoeMLP", cls("TensorParallelMLP")},
                                     {"Qwen2MoeSparseMoeBlock", cls("ExpertParallelBlock")},
                                     {"Qwen2MoeExperts", cls("ExpertParallelExperts")}});
  const auto rss_before = status_kib("VmRSS");
  const auto model = from_pretrained(model_dir);
  const auto grew = status_kib("VmHWM") - rss_before;
  int64_t expert_bytes = 0, other_bytes = 0;
  for (const auto& p : model->named_parameters()) {
    const auto bytes = p.value().numel() * static_cast<int64_t>(p.value().element_size());
    (p.key().find(".experts.") != std::string::npos ? expert_bytes : other_bytes) += bytes;
  }
  GenerationConfig config;
  config.max_new_tokens = 16;
  config.do_sample = true;
  config.top_k = 0;
  config.seed = 1000 + (group ? group->rank() : 0);
  if (group && std::getenv("TORCHPATCH_TEST_EP_AGREE")) {
    config.agree_tokens = [&](at::Tensor& tokens) { group->broadcast(tokens, 0); };
  }
  const auto out = generate(*model, at::arange(1, 6, at::kLong).unsqueeze(0), {}, config);
  const auto tokens = out.sequences[0].contiguous();
  std::cout << fmt::format("ep rank: experts={} other={} grew_kib={} tokens={}\n", expert_bytes, other_bytes, grew,
                           fmt::join(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel(), ","))
            << std::flush;
}

TEST_CASE("expert parallelism: each of two ranks holds half the experts and grows by about half the memory", "[dist]") {
  const auto dir = write_moe_checkpoint(16, 256, 512);
  const auto one = run_ranks(1, dir);
  INFO(one[0].out);
  REQUIRE(one[0].code == 0);
  const auto whole = report_of(one[0]);
  const auto ranks = run_ranks(2, dir);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ":\n" << ranks[rank].out);
    REQUIRE(ranks[rank].code == 0);
    const auto share = report_of(ranks[rank]);
    CHECK(std::stoll(share.at("experts")) * 2 == std::stoll(whole.at("experts")));
    // Attention and the shared expert are split as well; embeddings, norms, routers and lm_head are not.
    CHECK(std::stoll(share.at("other")) < std::stoll(whole.at("other")));
    const double ratio = std::stod(share.at("grew_kib")) / std::stod(whole.at("grew_kib"));
    std::cout << fmt::format("rank {}: weights {} of {} bytes, memory growth {:.2f} of one process's\n", rank,
                             std::stoll(share.at("experts")) + std::stoll(share.at("other")),
                             std::stoll(whole.at("experts")) + std::stoll(whole.at("other")), ratio);
    CHECK(ratio < 0.7);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("ranks sampling with different seeds agree on rank 0's tokens, and differ without the agreement", "[dist]") {
  const auto dir = write_moe_checkpoint(4, 64, 32);
  const auto agreed = run_ranks(2, dir, "TORCHPATCH_TEST_EP_AGREE=1");
  const auto apart = run_ranks(2, dir);
  for (const auto* ranks : {&agreed, &apart}) {
    for (const auto& rank : *ranks) {
      INFO(rank.out);
      REQUIRE(rank.code == 0);
    }
  }
  CHECK(report_of(agreed[0]).at("tokens") == report_of(agreed[1]).at("tokens"));
  CHECK(report_of(apart[0]).at("tokens") != report_of(apart[1]).at("tokens"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("experts that do not split over the ranks are a clear error on every rank", "[cli][dist]") {
  const auto dir = write_moe_checkpoint(6, 64, 32);
  const auto ranks = testutil::run_group(4, TORCHPATCH_CLI, "run --model " + dir.string() + " --prompt-ids 1,2,3");
  for (const auto& rank : ranks) {
    INFO(rank.out);
    CHECK(rank.code == 1);
    CHECK_THAT(rank.out, Contains("model.layers.0.mlp.experts: 6 experts do not split over 4 ranks"));
  }
  std::filesystem::remove_all(dir);
}
