// Hostile and careless input: deep JSON, FIFOs where files belong, trailing garbage, and saves that
// are killed part-way or run out of space. Each case asserts the exact message and exit code.
#include "test_prelude.h"
#include "cli_util.h"
#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/error.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/json_file.h"
#include "torchpatch/models/config.h"
#include "torchpatch/nn/rotary.h"
#include "torchpatch/patching/class_table.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/runtime/auto.h"

extern char** environ;

using Catch::Matchers::Contains;
using testutil::ScratchDir;
using testutil::temp_file;
using testutil::torchpatch_cli;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string nested_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;
const fs::path kLlamaBasic = testutil::data_dir() / "llama_basic";

// llama_basic's config.json with `changes` merged in.
nlohmann::json llama_basic_config(const nlohmann::json& changes = nlohmann::json::object()) {
  auto config = torchpatch::ModelConfig::from_file(kLlamaBasic).raw;
  config.update(changes);
  return config;
}

// llama_basic's tensors in file order, to change before writing them out.
Tensors llama_basic_tensors() {
  const auto source = torchpatch::checkpoint::SafetensorsFile::open(kLlamaBasic / "model.safetensors");
  Tensors tensors;
  for (const auto& info : source->tensors()) tensors.emplace_back(info.name, source->tensor(info.name));
  return tensors;
}

// A checkpoint in `dir`: `config`, and `tensors` or else llama_basic's weights.
void write_checkpoint(const fs::path& dir, const nlohmann::json& config, const Tensors* tensors = nullptr) {
  write_text(dir / "config.json", config.dump());
  if (tensors) {
    torchpatch::checkpoint::save_safetensors(dir / "model.safetensors", *tensors);
  } else {
    fs::copy_file(kLlamaBasic / "model.safetensors", dir / "model.safetensors");
  }
}

// The model_type of DIR's checkpoint, after loading it strictly: "" when it does not load.
std::string loads_as(const fs::path& dir) {
  try {
    return torchpatch::from_pretrained(dir)->config().model_type;
  } catch (const std::exception& e) {
    UNSCOPED_INFO("does not load: " << e.what());
    return "";
  }
}

}  // namespace

// -- bounded JSON ------------------------------------------------------------------------------------

TEST_CASE("config.json nested 100,000 deep is refused without recursion", "[hardening][json]") {
  ScratchDir dir("deep-config");
  write_text(dir.path / "config.json", "{\"model_type\": \"llama\", \"x\": " + nested_array(100000) + "}");
  CHECK_THROWS_WITH(torchpatch::ModelConfig::from_file(dir.path),
                    (dir.path / "config.json").string() + ": JSON nested more than 64 levels deep");
  const auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("config.json: JSON nested more than 64 levels deep"));
}

TEST_CASE("trailing bytes after config.json's object are an error", "[hardening][json]") {
  ScratchDir dir("trailing-config");
  const auto good = torchpatch::ModelConfig::from_file(kLlamaBasic).raw.dump();
  write_text(dir.path / "config.json", good + " {\"model_type\": \"bert\"}");
  CHECK_THROWS_WITH(torchpatch::ModelConfig::from_file(dir.path), Contains("config.json: not valid JSON") &&
                                                                      Contains("expected end of input"));
}

TEST_CASE("a safetensors header nested deep in 'shape' is refused", "[hardening][json][safetensors]") {
  ScratchDir dir("deep-header");
  std::string header = "{\"w\": {\"dtype\": \"F32\", \"shape\": " + nested_array(60000) + ", \"data_offsets\": [0, 0]}}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(dir.path / "w.safetensors", bytes + header);
  CHECK_THROWS_WITH(torchpatch::checkpoint::SafetensorsFile::open(dir.path / "w.safetensors"),
                    (dir.path / "w.safetensors").string() + ": header JSON nested more than 8 levels deep");
}

// Wide JSON parses in time linear in its size: the depth limit once rode on a callback parser that
// re-scanned an object whenever a member closed (40,000 header entries took 13 s, 200,000 over a minute).
// The growth from a tenth of the size to the whole is held to a ratio that linear time meets and
// quadratic time does not, so a slow or busy machine (or a sanitizer build) changes nothing.
namespace {
std::string wide_safetensors(int entries) {
  std::string header = "{";
  for (int i = 0; i < entries; ++i) {
    header += fmt::format("{}\"t{}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}", i ? "," : "", i,
                          4 * i, 4 * i + 4);
  }
  header += "}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(4 * static_cast<size_t>(entries), '\0');
}
}  // namespace

TEST_CASE("a safetensors header's parse time grows linearly, to 200,000 entries", "[hardening][json][safetensors]") {
  ScratchDir dir("wide-header");
  for (const int entries : {20000, 200000}) write_text(dir.path / fmt::format("w{}.safetensors", entries), wide_safetensors(entries));
  const double growth = testutil::growth_over_tenfold("safetensors header entries", 200000, [&](int64_t entries) {
    const auto file = torchpatch::checkpoint::SafetensorsFile::open(dir.path / fmt::format("w{}.safetensors", entries));
    REQUIRE(file->tensors().size() == static_cast<size_t>(entries));
  });
  CHECK(growth < testutil::kLinearGrowthBound);
}

TEST_CASE("config.json's parse time grows linearly, to 100,000 empty objects in an unused field", "[hardening][json]") {
  ScratchDir dir("wide-config");
  for (const int objects : {10000, 100000}) {
    auto config = llama_basic_config().dump();
    std::string wide = "[";
    for (int i = 0; i < objects; ++i) wide += i ? ",{}" : "{}";
    wide += "]";
    config.insert(config.size() - 1, ",\"unused\":" + wide);
    fs::create_directories(dir.path / std::to_string(objects));
    write_text(dir.path / std::to_string(objects) / "config.json", config);
  }
  const double growth = testutil::growth_over_tenfold("config.json objects", 100000, [&](int64_t objects) {
    const auto parsed = torchpatch::ModelConfig::from_file(dir.path / std::to_string(objects));
    REQUIRE(parsed.raw.at("unused").size() == static_cast<size_t>(objects));
  });
  CHECK(growth < testutil::kLinearGrowthBound);
}

// -- only regular files ------------------------------------------------------------------------------

TEST_CASE("a FIFO in place of config.json, the weights or --inputs is refused at once", "[hardening][fifo]") {
  ScratchDir dir("fifo");
  REQUIRE(::mkfifo((dir.path / "config.json").c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(torchpatch::ModelConfig::from_file(dir.path),
                    (dir.path / "config.json").string() + ": a FIFO, not a regular file");

  fs::remove(dir.path / "config.json");
  fs::copy_file(kLlamaBasic / "config.json", dir.path / "config.json");
  REQUIRE(::mkfifo((dir.path / "model.safetensors").c_str(), 0600) == 0);
  auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains((dir.path / "model.safetensors").string() + ": not a regular file"));

  r = torchpatch_cli("run --preset tiny-llama --inputs " + (dir.path / "model.safetensors").string());
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("model.safetensors: not a regular file"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // nothing waited for a writer
}

TEST_CASE("a directory as config.json and an empty --model say what they are", "[hardening]") {
  ScratchDir dir("dir-config");
  fs::create_directory(dir.path / "config.json");
  auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains((dir.path / "config.json").string() + ": a directory, not a regular file"));
  r = torchpatch_cli("run --model '' --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("model path is empty"));
}

// -- a checkpoint is replaced as a whole -------------------------------------------------------------

TEST_CASE("saving over a sharded checkpoint as one file removes the old shards and keeps other files",
          "[hardening][save]") {
  ScratchDir dir("resave");
  const auto out = dir.path / "ckpt";
  auto r = torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string());
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(out / "model.safetensors.index.json"));
  write_text(out / "tokenizer.json", "{}");
  r = torchpatch_cli("save --preset tiny-mistral --out " + out.string());
  REQUIRE(r.code == 0);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(out)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"});
  CHECK(loads_as(out) == "mistral");
  // Nothing of the staging directories is left beside it.
  for (const auto& entry : fs::directory_iterator(dir.path)) CHECK(entry.path().filename() == "ckpt");
}

namespace {
// A model to save that, while the save writes its files, drops a file into the checkpoint directory
// as another process writing there meanwhile would.
class WritesMeanwhile : public torchpatch::checkpoint::Loadable {
 public:
  WritesMeanwhile(std::shared_ptr<torchpatch::PretrainedModel> model, fs::path stray)
      : model_(std::move(model)), stray_(std::move(stray)) {}
  torch::nn::Module& module() override { return *model_; }
  const torch::nn::Module& module() const override { return *model_; }
  const std::string& class_name() const override { return model_->class_name(); }
  const torchpatch::Config& config() const override { return model_->config(); }
  std::vector<torchpatch::PatchPoint> patch_points() const override { return model_->patch_points(); }
  std::map<std::string, std::string> tied_weights() const override { return model_->tied_weights(); }
  std::string base_model_prefix() const override { return model_->base_model_prefix(); }
  std::vector<std::string> ignored_checkpoint_keys() const override { return model_->ignored_checkpoint_keys(); }
  nlohmann::json config_json() const override {
    write_text(stray_, "written meanwhile");
    return model_->config_json();
  }

 private:
  std::shared_ptr<torchpatch::PretrainedModel> model_;
  fs::path stray_;
};
}  // namespace

TEST_CASE("a save leaves files another process writes into the directory meanwhile", "[hardening][save]") {
  ScratchDir dir("written-meanwhile");
  const auto out = dir.path / "ckpt";
  REQUIRE(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string()).code == 0);
  const WritesMeanwhile model(torchpatch::from_pretrained(kLlamaBasic), out / "tokenizer.json");
  torchpatch::checkpoint::save_pretrained(model, out);
  CHECK(fs::exists(out / "tokenizer.json"));
  CHECK(!fs::exists(out / "model.safetensors.index.json"));  // the old layout's files go
  CHECK(loads_as(out) == "llama");
}

TEST_CASE("files written into the directory while saves run all survive", "[hardening][save]") {
  ScratchDir dir("written-during-saves");
  const auto out = dir.path / "ckpt";
  REQUIRE(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string()).code == 0);
  const std::string save = std::string(TORCHPATCH_CLI) + " save --max-shard-bytes 30000 --out " + out.string();
  const std::string loop = "for i in 1 2 3 4; do " + save + " --preset tiny-mistral >/dev/null && " + save +
                           " --preset tiny-llama >/dev/null || exit 1; done";
  const char* argv[] = {"/bin/sh", "-c", loop.c_str(), nullptr};
  pid_t saver = -1;
  REQUIRE(posix_spawn(&saver, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) == 0);
  int written = 0, status = 0;
  while (::waitpid(saver, &status, WNOHANG) == 0) {
    write_text(out / fmt::format("notes-{}.txt", written++), "another process's file");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  int kept = 0;
  for (int i = 0; i < written; ++i) kept += fs::exists(out / fmt::format("notes-{}.txt", i));
  CHECK(kept == written);
  WARN(written << " files written during 8 saves, " << kept << " kept");
  CHECK(loads_as(out) == "llama");
}

TEST_CASE("routing record on a full disk is an error naming the file, and leaves no file", "[hardening][save][routing]") {
  ScratchDir dir("full-disk-routes");
  const auto routes = dir.path / "routes.npy";
  // A file-size limit of zero stands in for a full disk: every write fails with EFBIG.
  const auto r = torchpatch_cli("routing record --model " + (testutil::data_dir() / "qwen2_moe_basic").string() +
                                    " --prompt-ids 5,6,7,8 --max-new-tokens 4 --out " + routes.string(),
                                "ulimit -f 0; trap '' XFSZ;");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains(routes.string() + ": cannot write") && Contains("File too large"));
  CHECK_THAT(r.out, !Contains("written"));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a save that runs out of space leaves the old checkpoint loadable", "[hardening][save]") {
  ScratchDir dir("full-disk");
  const auto out = dir.path / "ckpt";
  REQUIRE(torchpatch_cli("save --preset tiny-llama --out " + out.string()).code == 0);
  // A file-size limit stands in for a full disk: writes past 64 KiB fail with EFBIG (the signal is ignored).
  const auto r = torchpatch_cli("save --preset tiny-mistral --out " + out.string(), "ulimit -f 64; trap '' XFSZ;");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("cannot write") && Contains("File too large"));
  CHECK(loads_as(out) == "llama");
  for (const auto& entry : fs::directory_iterator(dir.path)) CHECK(entry.path().filename() == "ckpt");
}

TEST_CASE("torchpatch save killed at any moment leaves the old or the new checkpoint, complete",
          "[hardening][save][kill]") {
  ScratchDir dir("killed-save");
  const auto out = dir.path / "ckpt";
  REQUIRE(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string()).code == 0);
  const std::vector<std::string> argv{TORCHPATCH_CLI, "save", "--preset", "tiny-mistral", "--max-shard-bytes", "30000",
                                      "--out", out.string()};
  auto spawn = [&] {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    REQUIRE(posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    return pid;
  };
  // How long a whole save takes here, then kills spread over it.
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  ::waitpid(spawn(), &status, 0);
  REQUIRE(WIFEXITED(status));
  const auto whole = std::chrono::steady_clock::now() - start;
  REQUIRE(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string()).code == 0);
  std::map<std::string, int> outcomes;
  const int kills = 24;
  for (int i = 0; i < kills; ++i) {
    const pid_t pid = spawn();
    // Most of a run is starting up; the kills favour its second part, where the files are written.
    std::this_thread::sleep_for(whole * (0.3 + 0.7 * (i + 0.5) / kills));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    const auto type = loads_as(out);
    INFO("kill " << i);
    CHECK((type == "llama" || type == "mistral"));
    outcomes[type]++;
    // The load completed or discarded what the killed save left: no staging or commit directory in
    // it, and nothing beside it (saves once left a hidden copy of the checkpoint there).
    for (const auto& entry : fs::directory_iterator(out)) CHECK(entry.path().filename().string().rfind(".torchpatch-", 0) != 0);
    for (const auto& entry : fs::directory_iterator(dir.path)) CHECK(entry.path().filename() == "ckpt");
  }
  WARN("outcomes of " << kills << " kills: llama (old) " << outcomes["llama"] << ", mistral (new) " << outcomes["mistral"]);
}

TEST_CASE("readers while saves replace the checkpoint load the old or the new one, never a mix",
          "[hardening][save][readers]") {
  ScratchDir dir("read-during-save");
  const auto out = dir.path / "ckpt";
  REQUIRE(torchpatch_cli("save --preset tiny-llama --max-shard-bytes 20000 --out " + out.string()).code == 0);
  // Saves alternating two families (a mix of their files cannot load strictly), in the background.
  const std::string save = std::string(TORCHPATCH_CLI) + " save --max-shard-bytes 30000 --out " + out.string();
  const std::string loop = "for i in 1 2 3 4 5 6 7 8; do " + save + " --preset tiny-mistral && " + save +
                           " --preset tiny-llama || exit 1; done";
  const char* argv[] = {"/bin/sh", "-c", loop.c_str(), nullptr};
  pid_t saver = -1;
  REQUIRE(posix_spawn(&saver, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) == 0);
  std::map<std::string, int> outcomes;
  int status = 0;
  while (::waitpid(saver, &status, WNOHANG) == 0) {
    const auto type = loads_as(out);
    CHECK((type == "llama" || type == "mistral"));
    outcomes[type]++;
  }
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(outcomes["llama"] + outcomes["mistral"] > 10);
  WARN("loads during 16 saves: llama " << outcomes["llama"] << ", mistral " << outcomes["mistral"]);
}

// -- scoped registrations ----------------------------------------------------------------------------

namespace {
torchpatch::ModuleClass renamed_mlp(const std::string& name) {
  auto cls = *torchpatch::builtin_class_table().find("LlamaMLP");
  cls.name = name;
  return cls;
}
std::string class_under(const torchpatch::PatchRegistry& registry, const std::string& key) {
  const auto mapping = registry.get_patch_mapping();
  const auto* cls = mapping.get(key);
  return cls ? cls->name : "(none)";
}
}  // namespace

TEST_CASE("scoped mappings on one key closed out of order restore exactly what each changed", "[hardening][scope]") {
  using torchpatch::ScopedPatchMapping;
  torchpatch::PatchRegistry registry;
  registry.register_patch_mapping({{"LlamaMLP", renamed_mlp("Plain")}});
  auto first = std::make_unique<ScopedPatchMapping>(torchpatch::PatchMapping::Items{{"LlamaMLP", renamed_mlp("First")}},
                                                    true, registry);
  auto second = std::make_unique<ScopedPatchMapping>(
      torchpatch::PatchMapping::Items{{"LlamaMLP", renamed_mlp("Second")}}, true, registry);
  CHECK(class_under(registry, "LlamaMLP") == "Second");
  first.reset();  // the outer guard first: the inner one's entry stays in force
  CHECK(class_under(registry, "LlamaMLP") == "Second");
  second.reset();
  CHECK(class_under(registry, "LlamaMLP") == "Plain");

  registry.clear_patch_mapping();
  first = std::make_unique<ScopedPatchMapping>(torchpatch::PatchMapping::Items{{"LlamaMLP", renamed_mlp("First")}},
                                               false, registry);
  second = std::make_unique<ScopedPatchMapping>(torchpatch::PatchMapping::Items{{"LlamaMLP", renamed_mlp("Second")}},
                                                true, registry);
  first.reset();
  second.reset();
  CHECK(class_under(registry, "LlamaMLP") == "(none)");  // nobody's entry is left behind
}

TEST_CASE("scoped mappings on one key from two threads leave nothing behind", "[hardening][scope][threads]") {
  torchpatch::PatchRegistry registry;
  int leftovers = 0;
  for (int round = 0; round < 200; ++round) {
    auto guard = [&](const std::string& name, int hold_us) {
      torchpatch::ScopedPatchMapping scoped({{"LlamaMLP", renamed_mlp(name)}}, /*overwrite=*/true, registry);
      std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
    };
    std::thread a(guard, "A", 50 + round % 7 * 20), b(guard, "B", 50 + round % 5 * 30);
    a.join();
    b.join();
    leftovers += registry.get_patch_mapping().empty() ? 0 : 1;
  }
  CHECK(leftovers == 0);
}

// -- integers from the user --------------------------------------------------------------------------

TEST_CASE("max_new_tokens near INT64_MAX is refused without overflow", "[hardening][generate]") {
  const auto r = torchpatch_cli("generate --preset tiny-llama --prompt-ids 1,2 --max-new-tokens 9223372036854775807");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("max_new_tokens 9223372036854775807 = more than 2^63 positions, more than the model "
                             "supports (256"));
}

TEST_CASE("longrope factors of the wrong count are refused when the model is built", "[hardening][rope]") {
  torchpatch::nn::RopeOptions options;
  options.rope.kind = torchpatch::nn::RopeKind::kLongrope;
  options.rope.rope_type = "longrope";
  options.rope.original_max_position_embeddings = 64;
  options.rope.short_factor = std::vector<double>(4, 1.0);
  options.rope.long_factor = std::vector<double>(3, 1.0);
  options.head_dim = 8;
  options.max_position_embeddings = 128;
  CHECK_THROWS_WITH(torchpatch::nn::RotaryEmbedding(options),
                    Contains("longrope needs 4 factors (rotary dimension 8 / 2), got 3"));
}

TEST_CASE("bench --repeats and --threads past what an int holds are usage errors", "[hardening][cli]") {
  auto r = torchpatch_cli("bench --preset tiny-llama --threads 4294967297");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--threads: 4294967297 is more than 4096"));
  r = torchpatch_cli("bench --preset tiny-llama --repeats 4294967296");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--repeats: 4294967296 is more than 1000000"));
}

TEST_CASE("a LibTorch failure is one line naming its cause; --debug adds the backtrace", "[hardening][cli]") {
  ScratchDir dir("storage-overflow");
  // Passes the config checks, overflows LibTorch's storage size.
  write_checkpoint(dir.path, llama_basic_config({{"intermediate_size", int64_t{1} << 62}}));
  // Past the size checks (which would refuse it first) to LibTorch's own.
  const std::string past_checks = " --allow-incomplete --no-memory-check";
  auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1" + past_checks);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("error: Storage size calculation overflowed") &&
                        Contains("(from LibTorch; --debug shows where)") && !Contains("Exception raised from"));
  CHECK(testutil::count(r.out, "\n") == 1);
  r = torchpatch_cli("run --debug --model " + dir.path.string() + " --prompt-ids 1" + past_checks);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("Exception raised from"));
}

// -- absurd configs: refused before anything is allocated ----------------------------------------------

namespace {

// llama_basic's checkpoint with config.json fields changed.
struct ChangedConfig {
  ScratchDir dir;
  ChangedConfig(const std::string& name, const nlohmann::json& changes) : dir(name) {
    write_checkpoint(dir.path, llama_basic_config(changes));
  }
  std::string run(const std::string& extra = "") const {
    const auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1" + extra);
    return r.code == 1 ? r.out : fmt::format("(exit {}) {}", r.code, r.out);
  }
};

std::string config_error(const nlohmann::json& changes) {
  try {
    torchpatch::ModelConfig::from_json(llama_basic_config(changes), "config.json");
  } catch (const torchpatch::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("sizes that cannot fit the checkpoint are refused before building", "[hardening][config]") {
  const double before = testutil::peak_resident_mb();
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"num_hidden_layers", 1000000}, {"vocab_size", int64_t{1000000000000}}, {"hidden_size", int64_t{1} << 40},
           {"head_dim", int64_t{1} << 40}, {"intermediate_size", int64_t{1} << 62}}) {
    INFO(field << " = " << value);
    const ChangedConfig changed("absurd-" + field, {{field, value}});
    CHECK_THAT(changed.run(), Contains("config.json: describes a model of at least") &&
                                  Contains("but the checkpoint's tensors hold") && Contains("before building anything") &&
                                  Contains("most of them are") && Contains(field + " " + value.dump()));
  }
  // Not building 10^6 layers first: the tiny config's layers alone would take gigabytes.
  CHECK(testutil::peak_resident_mb() - before < 200);
}

TEST_CASE("num_hidden_layers 10^8 and 10^9 are refused at once, naming the field", "[hardening][config]") {
  for (const int64_t layers : {int64_t{100000000}, int64_t{1000000000}}) {
    const double before = testutil::peak_resident_mb();
    CHECK(config_error({{"num_hidden_layers", layers}}) ==
          fmt::format("config.json: num_hidden_layers {} is more than the 1000000 layers torchpatch builds", layers));
    CHECK(testutil::peak_resident_mb() - before < 200);  // no per-layer list of 10^8 entries first (6.4 GB)
  }
}

TEST_CASE("generate with unbounded positions refuses a cache larger than memory before allocating",
          "[hardening][generate]") {
  // Dynamic NTK RoPE follows any length, so max_new_tokens 10^12 passes the position limit; the tokens
  // and key/value cache of 10^12 positions cannot fit (LibTorch was once asked for 8 TB).
  auto config = torchpatch::preset_config("tiny-llama").raw;
  config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  const auto model = torchpatch::from_config(torchpatch::ModelConfig::from_json(config, "dynamic"));
  torchpatch::GenerationConfig generation;
  generation.max_new_tokens = 1000000000000;
  const double before = testutil::peak_resident_mb();
  CHECK_THROWS_WITH(torchpatch::generate(*model, at::tensor(std::vector<int64_t>{1, 2, 3}).view({1, 3}), {}, generation),
                    Contains("prompt of 3 tokens + max_new_tokens 1000000000000 = 1000000000003 positions") &&
                        Contains("more than this machine's") && Contains("lower max_new_tokens"));
  CHECK(testutil::peak_resident_mb() - before < 200);  // nothing of the cache was allocated first
}

TEST_CASE("a model larger than the machine's memory is refused with both figures", "[hardening][config]") {
  const ChangedConfig changed("absurd-memory", {{"vocab_size", int64_t{1000000000000}}});
  CHECK_THAT(changed.run(" --allow-incomplete"),
             Contains("a model of at least") && Contains("TB as Float, more than this machine's") &&
                 Contains("GB of memory") && Contains("--no-memory-check"));
}

TEST_CASE("rope_theta, rms_norm_eps and yarn's betas that give NaN are refused", "[hardening][config]") {
  CHECK_THAT(config_error({{"rope_theta", 0}}), Contains("config.json: rope_theta must be positive, got 0"));
  CHECK_THAT(config_error({{"rope_theta", -10000.0}}), Contains("rope_theta must be positive, got -10000"));
  CHECK_THAT(config_error({{"rms_norm_eps", -1e-6}}), Contains("config.json: rms_norm_eps must be >= 0, got -1e-06"));
  CHECK_THAT(config_error({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 2.0},
                                             {"beta_slow", 2.0}}}}),
             Contains("config.json: rope_scaling: beta_fast must differ from beta_slow, both are 2"));
  // Not from a file (JSON text has no infinity; 1e400 is a parse error), but a host may build one.
  CHECK_THAT(config_error({{"rope_theta", std::numeric_limits<double>::infinity()}}),
             Contains("field 'rope_theta' must be a finite number"));
  const ChangedConfig changed("theta-zero", {{"rope_theta", 0}});
  CHECK_THAT(changed.run(), Contains("rope_theta must be positive"));
}

TEST_CASE("a rope factor of 1e308 saturates the position limit instead of overflowing", "[hardening][rope]") {
  const auto config = llama_basic_config({{"rope_scaling", {{"rope_type", "linear"}, {"factor", 1e308}}}});
  const auto parsed = torchpatch::ModelConfig::from_json(config, "config.json");
  CHECK(parsed.decoder.max_positions() == std::numeric_limits<int64_t>::max());
}

// -- checkpoints that hold the wrong things ------------------------------------------------------------

namespace {

// llama_basic with one tensor replaced by `value`.
void with_tensor(const ScratchDir& dir, const std::string& name, const at::Tensor& value) {
  auto tensors = llama_basic_tensors();
  for (auto& [tensor_name, tensor] : tensors) {
    if (tensor_name == name) tensor = value;
  }
  write_checkpoint(dir.path, llama_basic_config(), &tensors);
}

at::Tensor llama_basic_tensor(const std::string& name) {
  return torchpatch::checkpoint::SafetensorsFile::open(kLlamaBasic / "model.safetensors")->tensor(name).clone();
}

const char* kNormWeight = "model.layers.0.input_layernorm.weight";

}  // namespace

TEST_CASE("an integer tensor under a float weight's name is reported, not cast", "[hardening][load]") {
  ScratchDir dir("int-weight");
  with_tensor(dir, kNormWeight, at::ones(llama_basic_tensor(kNormWeight).sizes(), at::kInt));
  const auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains(std::string("tensor '") + kNormWeight + "' is stored as Int but the parameter is Float: not cast"));
}

TEST_CASE("non-finite weights are a warning naming the tensor, an error with --strict", "[hardening][load]") {
  ScratchDir dir("nan-weight");
  auto poisoned = llama_basic_tensor(kNormWeight);
  poisoned.index_put_({0}, std::numeric_limits<float>::quiet_NaN());
  poisoned.index_put_({1}, std::numeric_limits<float>::infinity());
  with_tensor(dir, kNormWeight, poisoned);
  auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK_THAT(r.out, Contains(std::string("warning: ") + dir.path.string()) &&
                        Contains(std::string("tensor '") + kNormWeight + "' holds 2 non-finite values"));
  r = torchpatch_cli("run --strict --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("tensors hold values that are not finite") &&
                        Contains(std::string("tensor '") + kNormWeight + "': 2 non-finite values"));
  // Generating from a model whose logits are NaN says so instead of sampling garbage.
  r = torchpatch_cli("generate --model " + dir.path.string() + " --prompt-ids 1,2 --do-sample --seed 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("cannot choose token 1: the model's logits hold NaN"));
  r = torchpatch_cli("generate --model " + dir.path.string() + " --prompt-ids 1,2");  // greedy
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("cannot choose token 1: the model's logits hold NaN"));
}

TEST_CASE("thousands of stray tensors give a bounded report with escaped names", "[hardening][load]") {
  ScratchDir dir("stray-tensors");
  auto tensors = llama_basic_tensors();
  for (int i = 0; i < 5000; ++i) tensors.emplace_back(fmt::format("stray.{}", i), at::zeros({1}));
  tensors.emplace_back("evil\x1b[2J\nloaded fake [bundled]", at::zeros({1}));
  write_checkpoint(dir.path, llama_basic_config(), &tensors);
  const auto r = torchpatch_cli("run --model " + dir.path.string() + " --prompt-ids 1");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("... and 4951 more"));
  CHECK(r.out.size() < 10000);
  CHECK(r.out.find('\x1b') == std::string::npos);
}

TEST_CASE("eos ids out of range on the command line name the option, not pad_token_id", "[hardening][generate]") {
  const auto r = torchpatch_cli("generate --model " + testutil::llama_dir() + " --prompt-ids 1,2 --eos-ids 999999");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--eos-ids: token id 999999 is out of range for vocab_size"));
}

// -- patterns that backtrack without end (found by fuzz_conversion_patterns) ---------------------------

TEST_CASE("a pattern too costly to match is an error naming it, not an escaped Boost exception",
          "[hardening][regex]") {
  namespace ckpt = torchpatch::checkpoint;
  const ckpt::ConversionPlan plan({{"", {ckpt::WeightRenaming{"^model\\.(.*)*\\~", "x"}}, false}});
  CHECK_THROWS_MATCHES(plan.route("model.layers.0.self_attn.q_proj.weight.and.a.long.tail.of.segments"),
                       torchpatch::CheckpointError,
                       Catch::Matchers::Message(
                           "conversion pattern '^model\\.(.*)*\\~' is too costly to match against "
                           "'model.layers.0.self_attn.q_proj.weight.and.a.long.tail.of.segments' (it backtracks "
                           "without end); simplify the pattern"));
  torchpatch::PatchRegistry registry;
  registry.register_patch_mapping({{"^Llama(.*)*\\~", renamed_mlp("CostlyMLP")}});
  CHECK_THROWS_WITH(registry.get_patch_mapping().find("LlamaDecoderLayerWithAVeryLongNameIndeedReally"),
                    Contains("patch key '^Llama(.*)*\\~' is too costly to match against class "
                             "'LlamaDecoderLayerWithAVeryLongNameIndeedReally'"));
  // A plugin's key names the plugin.
  auto from_plugin = renamed_mlp("PluginMLP");
  from_plugin.origin = {"costly-keys", "1.0.0", "/plugins/costly.so"};
  torchpatch::PatchRegistry plugin_registry;
  plugin_registry.register_patch_mapping({{"^Qwen(.*)*\\~", from_plugin}});
  CHECK_THROWS_WITH(plugin_registry.get_patch_mapping().find("QwenDecoderLayerWithAVeryLongNameIndeedReally"),
                    Contains("patch key '^Qwen(.*)*\\~' (registered by plugin costly-keys 1.0.0 (/plugins/costly.so)) "
                             "is too costly to match"));
}

// -- untrusted text reaches the terminal escaped and cut -----------------------------------------------

TEST_CASE("escape sequences in config strings are printed escaped", "[hardening][messages]") {
  for (const auto& [field, value, expected] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"model_type", "\x1b[2Jllama", "model_type '\\x1B[2Jllama' is not supported"},
           {"hidden_act", "\x1b]0;owned\x07", "hidden_act: unsupported activation '\\x1B]0;owned\\x07'"},
           {"rope_scaling", {{"rope_type", "\x1b[31mred"}, {"factor", 2.0}},
            "unsupported rope_type '\\x1B[31mred'"}}) {
    INFO(field);
    const ChangedConfig changed("escape-" + field, {{field, value}});
    const auto out = changed.run();
    CHECK_THAT(out, Contains(expected));
    CHECK(out.find('\x1b') == std::string::npos);
  }
}

TEST_CASE(".npy errors name the --routes file, escaped and cut", "[hardening][messages][routing]") {
  ScratchDir dir("npy-messages");
  const auto model = (testutil::data_dir() / "qwen2_moe_basic").string();
  auto npy = [&](const std::string& name, const std::string& header, const std::string& data = "") {
    std::string bytes = "\x93NUMPY";
    bytes += '\x01';
    bytes += '\x00';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    write_text(dir.path / name, bytes + header + data);
    return torchpatch_cli("routing replay --model " + model + " --ids 5,6,7 --routes " + (dir.path / name).string());
  };
  // A NUL and an escape in the dtype: escaped, and the message goes on past the NUL.
  std::string header = "{'descr': '<i";
  header += '\0';
  header += "\x1b', 'fortran_order': False, 'shape': (1,), }";
  auto r = npy("nul.npy", header);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("nul.npy: not a readable .npy file: dtype '<i\\x00\\x1B' (int32, int64, float32, "
                             "float64 are read)"));
  // A 30 KB shape is cut.
  r = npy("wide.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1," + std::string(30000, ' ') + ",), }");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("wide.npy: not a readable .npy file: shape (1,") && Contains("more bytes)"));
  CHECK(r.out.size() < 1000);
  // An empty array whose other dimensions multiply past int64: refused before LibTorch lays it out.
  r = npy("vast.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (0, 999999999999999999, 99999999999), }");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("vast.npy: not a readable .npy file: shape (0, 999999999999999999, 99999999999) spans "
                             "more than 2^63 elements"));
  // What the routes say is checked later; that error names the file too.
  r = npy("flat.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", std::string(12, '\0'));
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains((dir.path / "flat.npy").string() + " (--routes): routed_experts: expected [tokens, "
                             "layers, top_k], got 1 dims"));
}

TEST_CASE("a temperature of 1e-320 is a number, refused for what it does to the logits", "[hardening][generate]") {
  const auto r = torchpatch_cli("generate --preset tiny-llama --prompt-ids 1,2 --do-sample --temperature 1e-320");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("temperature 1e-320 takes the logits past float32's range"));
  const auto huge = torchpatch_cli("generate --preset tiny-llama --prompt-ids 1,2 --do-sample --temperature 1e999");
  CHECK(huge.code == 2);
  CHECK_THAT(huge.out, Contains("--temperature: 1e999 is out of the range of a double"));
}
