// A plugin adds a whole model family: the CLI then builds, saves and runs that model_type, and
// `plugins --json` lists the family. The bundled phi3 plugin is such a family too.
#include "test_prelude.h"
#include "cli_util.h"

#include <fstream>

#include <nlohmann/json.hpp>

using Catch::Matchers::Contains;
using testutil::temp_file;
using testutil::torchpatch_cli;

namespace {
std::string toy_dir() { return std::string(TORCHPATCH_TEST_PLUGIN_DIR) + "/toy_family"; }
}  // namespace

TEST_CASE("a plugin family: the CLI builds, saves and runs its model_type", "[plugins][family][cli]") {
  const auto dir = temp_file("toy-checkpoint");
  std::filesystem::remove_all(dir);
  auto r = torchpatch_cli("save --preset tiny-toy --out " + dir.string() + " --plugin-dir " + toy_dir());
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream config(dir / "config.json");
  CHECK(nlohmann::json::parse(config).at("model_type") == "toy");

  r = torchpatch_cli("run --model " + dir.string() + " --prompt-ids 1,2,3 --plugin-dir " + toy_dir());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("ToyForCausalLM"));

  // Without the plugin the model_type is unknown, and the error lists what is supported.
  r = torchpatch_cli("run --model " + dir.string() + " --prompt-ids 1,2,3");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Contains("model_type 'toy' is not supported"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("plugins --json lists families, built in and from plugins", "[plugins][family][cli]") {
  const auto r = torchpatch_cli("plugins --json --plugin-dir " + toy_dir());
  REQUIRE(r.code == 0);
  const auto json = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  std::map<std::string, std::string> origins;
  for (const auto& family : json.at("families")) origins[family.at("model_type")] = family.at("origin");
  CHECK(origins.at("llama") == "builtin");
  CHECK(origins.at("gemma2") == "builtin");
  CHECK_THAT(origins.at("phi3"), Contains("plugin phi3 1.0.0"));
  CHECK_THAT(origins.at("toy"), Contains("plugin torchpatch-test-toy-family 0.1.0"));
  bool listed = false;
  for (const auto& plugin : json.at("plugins")) {
    if (plugin.at("name") == "torchpatch-test-toy-family") listed = plugin.at("families") == nlohmann::json{"toy"};
  }
  CHECK(listed);
}
