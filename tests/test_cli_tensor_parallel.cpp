// The CLI as ranks of one group (the variables torchrun sets): every decoder reference case split over
// two processes matches the reference, the MoE cases' expert choices exactly; four ranks replicate
// key/value heads; a world size that does not split the heads is an error before any weight is read.
// The --tp launcher: a rank killed mid-run, Ctrl-C and a port in use end every rank with a message.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/checkpoint.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/runtime/auto.h"

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
  const bool moe = name.find("moe") != std::string::npos || name.find("mixtral") != std::string::npos;
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
  if (moe) {
    CHECK_THAT(ranks[0].out, Contains("ExpertParallelExperts"));  // each rank runs its experts only
    CHECK_THAT(ranks[0].out, Contains("ExpertParallelBlock"));
  }
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(data_dir() / name / "reference.safetensors");
  const auto got = torchpatch::checkpoint::SafetensorsFile::open(out);
  const auto mask = ref->tensor("attention_mask");
  CHECK(close(name + " tp" + std::to_string(world) + " logits", got->tensor("logits"), ref->tensor("logits"), mask));
  CHECK(close(name + " tp" + std::to_string(world) + " hidden_states", got->tensor("hidden_states"),
              ref->tensor("hidden_states"), mask.unsqueeze(0)));
  if (moe) {
    const auto keep = mask.reshape({-1}).unsqueeze(-1).to(at::kBool).logical_not();
    int compared = 0;
    for (const auto& info : ref->tensors()) {  // every sparse layer the case has
      if (info.name.rfind("selected_experts_layer", 0) != 0) continue;
      INFO(name << " " << info.name);
      CHECK(at::equal(got->tensor(info.name).masked_fill(keep, -1), ref->tensor(info.name).masked_fill(keep, -1)));
      ++compared;
    }
    CHECK(compared == 2);
  }
  std::filesystem::remove(out);
}

// generate over `world` ranks on the case's padded batch: the reference's greedy ids exactly.
void check_generation(const std::string& name, int world) {
  const auto ref = torchpatch::checkpoint::SafetensorsFile::open(data_dir() / name / "reference.safetensors");
  const auto inputs = temp_file(name + "-tp-batch.safetensors"), out = temp_file(name + "-tp-generated.safetensors");
  torchpatch::checkpoint::save_safetensors(
      inputs, {{"input_ids", ref->tensor("input_ids")}, {"attention_mask", ref->tensor("attention_mask")}});
  const auto ranks = run_cli_group(world, "generate --model " + (data_dir() / name).string() + " --inputs " +
                                              inputs.string() + " --max-new-tokens 8 --ignore-eos --output " +
                                              out.string());
  for (const auto& rank : ranks) {
    INFO(name << ": " << rank.out);
    REQUIRE(rank.code == 0);
  }
  INFO(name << " generated_ids over " << world << " ranks");
  CHECK(at::equal(torchpatch::checkpoint::SafetensorsFile::open(out)->tensor("generated_ids"), ref->tensor("generated_ids")));
  std::filesystem::remove(inputs);
  std::filesystem::remove(out);
}

}  // namespace

TEST_CASE("two ranks match the reference on every decoder case, MoE expert choices and generated ids exactly", "[cli][dist]") {
  for (const char* name : {"llama_basic", "mistral_sliding_window", "gemma_basic", "phi3_fused", "qwen2_moe_basic",
                           "qwen3_moe_basic", "qwen3_dense_v5", "mixtral_basic_v5", "smollm3_nope_v5",
                           "granite_basic_v5", "gemma3_text_v5", "glm4_moe_basic_v5", "olmo2_basic_v5",
                           "olmoe_basic_v5"}) {
    check_case(name, 2);
    check_generation(name, 2);
  }
}

namespace {
struct Refused {
  std::string name, family, attention, kind;
  std::string message() const {
    return "its attention " + attention + " (family " + family + ") does not split between processes (the "
           "tensor-parallel plugin has no class for its kind '" + kind + "')";
  }
};
// DeepSeek-V3's latent attention shares one compressed key/value vector between its heads; GPT-OSS's
// sinks are not a block the tensor-parallel plugin splits yet.
const std::vector<Refused> kRefused{{"deepseek_v3_mla_v5", "deepseek_v3", "DeepseekV3Attention", "latent_attention"},
                                    {"gpt_oss_basic_v5", "gpt_oss", "GptOssAttention", "sink_attention"}};
}  // namespace

TEST_CASE("tp: a family whose attention does not split is refused once, before any rank starts", "[cli][dist]") {
  for (const auto& c : kRefused) {
    const auto result = torchpatch_cli("run --tp 2 --model " + (data_dir() / c.name).string() + " --prompt-ids 1,2,3");
    INFO(result.out);
    CHECK(result.code == 1);
    const auto message = c.message();
    const auto first = result.out.find(message);
    CHECK(first != std::string::npos);
    CHECK(result.out.find(message, first + 1) == std::string::npos);  // once
    CHECK_THAT(result.out, Contains("run it without --tp"));
    CHECK(result.out.find("rank") == std::string::npos);  // the launcher's report of ranks: none started
  }
  // A preset is looked up the same way.
  const auto preset = torchpatch_cli("generate --tp 2 --preset tiny-gpt-oss --prompt-ids 1,2 --max-new-tokens 1");
  INFO(preset.out);
  CHECK(preset.code == 1);
  CHECK_THAT(preset.out, Contains(kRefused[1].message()));
}

TEST_CASE("tp: an error every rank meets is said once", "[cli][dist]") {
  const auto same = torchpatch_cli("run --tp 2 --preset tiny-llama --prompt-ids 1,999");
  INFO(same.out);
  CHECK(same.code == 1);
  CHECK(count(same.out, "token id 999 at [0, 1] is out of range for vocab_size 256") == 1);
  CHECK(same.out.find("rank 1: ") == std::string::npos);
}

TEST_CASE("tp: ranks started by another launcher refuse such a family themselves", "[cli][dist]") {
  for (const auto& c : kRefused) {
    const auto ranks = run_cli_group(2, "run --model " + (data_dir() / c.name).string() + " --prompt-ids 1,2,3");
    for (const auto& rank : ranks) {
      INFO(rank.out);
      CHECK(rank.code == 1);
      CHECK_THAT(rank.out, Contains(c.message()));
      CHECK_THAT(rank.out, Contains("run it without --tp"));
    }
  }
}

TEST_CASE("four ranks (key/value heads replicated over two ranks each) match the reference", "[cli][dist]") {
  check_case("llama_basic", 4);
  check_case("qwen2_moe_basic", 4);  // two experts a rank
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

// -- faults: a rank killed mid-run, Ctrl-C, a port in use ------------------------------------------------

namespace {

// `torchpatch ARGS` started in the background, its stdout and stderr in a file.
struct Background {
  pid_t pid = -1;
  std::filesystem::path log;
  explicit Background(const std::string& arguments, const std::string& env = "") : log(temp_file("launcher.log")) {
    const auto command = env + " exec '" + std::string(TORCHPATCH_CLI) + "' " + arguments + " > '" + log.string() + "' 2>&1";
    pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    std::filesystem::remove(log);
  }
  std::string output() const {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Waits up to `limit` for the output to contain `text`.
  bool wait_for_output(const std::string& text, std::chrono::seconds limit) const {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (output().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // The exit code (128 + signal when killed), or nullopt when still running after `limit`.
  std::optional<int> wait_exit(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }
};

// The launcher's children by rank (from /proc: parent pid and the RANK variable).
std::map<int, pid_t> ranks_of(pid_t launcher) {
  std::map<int, pid_t> ranks;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    const auto close_paren = text.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(text.substr(close_paren + 2));
    std::string state;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent != launcher) continue;
    std::ifstream environ_file(entry.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(environ_file)), {});
    for (std::size_t pos = 0; (pos = env.find("RANK=", pos)) != std::string::npos; ++pos) {
      if (pos == 0 || env[pos - 1] == '\0') ranks[std::stoi(env.substr(pos + 5))] = std::stoi(name);
    }
  }
  return ranks;
}

bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

const char* kLongGeneration = "generate --tp 2 --preset llama-125m --prompt-ids 1,2,3 --max-new-tokens 2000";

}  // namespace

TEST_CASE("a rank killed mid-run: the others stop with a message naming it, and no rank is left", "[cli][dist]") {
  Background launcher(kLongGeneration);
  REQUIRE(launcher.wait_for_output("generating:", std::chrono::seconds(120)));
  const auto ranks = ranks_of(launcher.pid);
  REQUIRE(ranks.size() == 2);
  const auto killed = std::chrono::steady_clock::now();
  ::kill(ranks.at(1), SIGKILL);
  const auto code = launcher.wait_exit(std::chrono::seconds(30));
  INFO(launcher.output());
  REQUIRE(code);
  CHECK(*code != 0);
  CHECK_THAT(launcher.output(), Contains("rank 1 of 2 was killed by signal 9"));
  // Rank 0 is in a layer's all-reduce or in the broadcast of the step's token when its peer goes.
  CHECK_THAT(launcher.output(),
             Contains("rank 0 of 2: all-reduce failed") || Contains("rank 0 of 2: broadcast failed"));
  CHECK(std::chrono::steady_clock::now() - killed < std::chrono::seconds(30));
  for (const auto& [rank, pid] : ranks) CHECK(gone(pid));
}

TEST_CASE("Ctrl-C on the launcher stops every rank", "[cli][dist]") {
  Background launcher(kLongGeneration);
  REQUIRE(launcher.wait_for_output("generating:", std::chrono::seconds(120)));
  const auto ranks = ranks_of(launcher.pid);
  REQUIRE(ranks.size() == 2);
  ::kill(launcher.pid, SIGINT);
  const auto code = launcher.wait_exit(std::chrono::seconds(30));
  INFO(launcher.output());
  REQUIRE(code);
  CHECK(*code == 128 + SIGINT);
  for (const auto& [rank, pid] : ranks) CHECK(gone(pid));
}

TEST_CASE("a master port in use under --tp, and bad --tp values, are clear errors", "[cli][dist]") {
  const LoopbackPort busy(true);
  Background launcher("run --tp 2 --model " + llama_dir() + " --prompt-ids 1,2,3",
                      "MASTER_PORT=" + std::to_string(busy.number));
  const auto code = launcher.wait_exit(std::chrono::seconds(60));
  INFO(launcher.output());
  REQUIRE(code);
  CHECK(*code == 1);
  CHECK_THAT(launcher.output(), Contains(fmt::format("rank 0 cannot serve the group's store on port {}: the port is in use",
                                                     busy.number)));
  CHECK_THAT(launcher.output(), Contains("rank 0 of 2 exited with code 1"));

  auto r = torchpatch_cli("run --tp 0 --model " + llama_dir() + " --prompt-ids 1");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--tp: expected a number of processes from 1 to 64, got '0'"));
  r = torchpatch_cli("run --tp 2 --model " + llama_dir() + " --prompt-ids 1", "RANK=0 WORLD_SIZE=2");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--tp starts its own processes"));
  r = torchpatch_cli("plan --model " + llama_dir(), "RANK=0 WORLD_SIZE=2");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("plan does not run as a group of processes yet"));
  r = torchpatch_cli("run --tp 2 --model " + (data_dir() / "bert_model").string() + " --prompt-ids 1,2");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("nothing of it splits between processes"));
}

TEST_CASE("save --tp gathers every rank's slices and experts into the hub layout, bit for bit", "[cli][dist]") {
  const std::vector<std::pair<std::string, int>> runs{{"llama_basic", 2},     {"phi3_fused", 2}, {"qwen2_moe_basic", 2},
                                                      {"qwen3_moe_basic", 2}, {"olmo2_basic_v5", 2}, {"llama_basic", 4},
                                                      {"phi3_fused", 4}};
  for (const auto& [name, world] : runs) {  // four ranks: each key/value head held by two ranks
    INFO(name << " over " << world << " ranks");
    const auto out = temp_file(name + "-tp-saved");
    std::filesystem::remove_all(out);
    const auto dir = (data_dir() / name).string();
    const auto r = torchpatch_cli(fmt::format("save --tp {} --model {} --out {}", world, dir, out.string()));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("saved "));
    const auto original = torchpatch::checkpoint::Checkpoint::open(dir);
    const auto saved = torchpatch::checkpoint::Checkpoint::open(out);
    REQUIRE(saved.keys() == original.keys());
    for (const auto& key : original.keys()) {
      INFO(key);
      CHECK(at::equal(saved.tensor(key), original.tensor(key)));
    }
    std::filesystem::remove_all(out);
  }
}

TEST_CASE("presets without a reference case split over ranks match one process", "[cli][dist]") {
  struct Split {
    std::string preset, ids, attention;
    int world;
  };
  // tiny-gemma2: 14 tokens, past its sliding window of 8 on its even layers. tiny-olmo2 over four
  // ranks: its two key/value heads each held by two ranks, whose squares its k norm counts once.
  for (const auto& c : {Split{"tiny-gemma2", "5,6,7,8,9,10,11,12,13,14,15,16,17,18", "TensorParallelAttention", 2},
                        Split{"tiny-olmo2", "5,6,7,8,9,10", "TensorParallelProjectionQkNormAttention", 4}}) {
    const auto one = temp_file(c.preset + "-one.safetensors"), split = temp_file(c.preset + "-split.safetensors");
    const std::string run = "run --preset " + c.preset + " --prompt-ids " + c.ids + " --hidden-states --output ";
    auto r = torchpatch_cli(run + one.string());
    INFO(r.out);
    REQUIRE(r.code == 0);
    r = torchpatch_cli(run + split.string() + " --tp " + std::to_string(c.world));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains(c.attention));
    const auto a = torchpatch::checkpoint::SafetensorsFile::open(one), b = torchpatch::checkpoint::SafetensorsFile::open(split);
    for (const char* name : {"logits", "hidden_states"}) {
      const double diff = (a->tensor(name) - b->tensor(name)).abs().max().item<double>();
      std::cout << c.preset << " tp" << c.world << " against one process, " << name << ": max abs diff = " << diff << "\n";
      CHECK(diff < 1e-4);
    }
    std::filesystem::remove(one);
    std::filesystem::remove(split);
  }
}

TEST_CASE("verify --tp compares the split model with the whole one", "[cli][dist]") {
  for (const char* name : {"llama_basic", "qwen2_moe_basic"}) {
    const auto r = torchpatch_cli(std::string("verify --tp 2 --repeat 1 --model ") + (data_dir() / name).string());
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("Attention -> TensorParallelAttention"));
    CHECK(count(r.out, "PASS") == 1);  // rank 0 alone prints
    if (std::string(name) == "qwen2_moe_basic") {
      CHECK_THAT(r.out, Contains("Qwen2MoeExperts -> ExpertParallelExperts"));
      CHECK_THAT(r.out, Contains("top-k sets agree"));
      CHECK_THAT(r.out, !Contains("DIFFERENT"));
    }
  }
}

TEST_CASE("routing record --tp writes the routes one process records", "[cli][dist]") {
  for (const char* name : {"qwen2_moe_basic", "qwen3_moe_basic"}) {
    INFO(name);
    const auto one = temp_file(std::string(name) + "-routes.npy"), two = temp_file(std::string(name) + "-routes-tp2.npy");
    const auto record = std::string("routing record --prompt-ids 3,1,4,1,5,9,2,6 --max-new-tokens 6 --model ") +
                        (data_dir() / name).string() + " --out ";
    auto r = torchpatch_cli(record + one.string());
    REQUIRE(r.code == 0);
    const auto tokens = r.out.substr(r.out.find("tokens: "));
    r = torchpatch_cli(record + two.string() + " --tp 2");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.substr(r.out.find("tokens: ")) == tokens);
    std::ifstream a(one, std::ios::binary), b(two, std::ios::binary);
    const std::string bytes_one{std::istreambuf_iterator<char>(a), {}}, bytes_two{std::istreambuf_iterator<char>(b), {}};
    CHECK(bytes_one == bytes_two);
    std::filesystem::remove(one);
    std::filesystem::remove(two);
  }
}

TEST_CASE("routing replay --tp: the loss and the router gradient of one process", "[cli][dist]") {
  // Two tokens over four ranks: in some layer a rank's experts get no pair, and its backward pass must
  // still take part in every all-reduce.
  const std::vector<std::tuple<std::string, std::string, int>> runs{
      {"qwen2_moe_basic", "3,1,4,1,5,9,2,6", 2}, {"qwen3_moe_basic", "3,1,4,1,5,9,2,6", 2},
      {"qwen2_moe_basic", "3,1", 4}, {"qwen3_moe_basic", "7,2", 4},
      // Its q/k norms' squares summed over the ranks, and their gradients; an OLMoE with two key/value
      // heads over four ranks holds each on two ranks, whose k norm must count it once.
      {"olmoe_basic_v5", "3,1,4,1,5,9,2,6", 2}, {"olmoe-two-kv-heads", "3,1,4,1,5,9,2,6", 4}};
  const ScratchDir replicated("tp-olmoe-two-kv-heads");
  {
    auto config = torchpatch::preset_config("tiny-olmoe").to_json();
    config["num_key_value_heads"] = 2;
    const auto model = torchpatch::from_config(torchpatch::ModelConfig::from_json(config));
    torchpatch::init_random_weights(*model, 0);
    torchpatch::checkpoint::save_pretrained(*model, replicated.path);
  }
  for (const auto& [name, ids, world] : runs) {
    INFO(name << " over " << world << " ranks");
    const auto routes = temp_file(name + "-replay-routes.npy");
    const auto model = "--model " + (name == "olmoe-two-kv-heads" ? replicated.path : data_dir() / name).string();
    REQUIRE(torchpatch_cli("routing record --prompt-ids " + ids + " " + model + " --out " + routes.string()).code == 0);
    const auto replay = "routing replay --json --ids " + ids + " " + model + " --routes " + routes.string();
    const auto one = torchpatch_cli(replay), two = torchpatch_cli(replay + " --tp " + std::to_string(world));
    INFO(one.out << "\n" << two.out);
    REQUIRE(one.code == 0);
    REQUIRE(two.code == 0);
    const auto a = nlohmann::json::parse(one.out.substr(one.out.find('{'))),
               b = nlohmann::json::parse(two.out.substr(two.out.find('{')));
    std::cout << name << " replay tp" << world << " against one process: loss " << b["loss"] << " vs " << a["loss"]
              << ", router gradient norm " << b["router_grad_norm"] << " vs " << a["router_grad_norm"] << "\n";
    CHECK(std::abs(b["loss"].get<double>() - a["loss"].get<double>()) < 1e-5);
    CHECK(std::abs(b["router_grad_norm"].get<double>() / a["router_grad_norm"].get<double>() - 1) < 1e-4);
    std::filesystem::remove(routes);
  }
}
