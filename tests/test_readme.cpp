// The README shows real files verbatim: the host-API example, the bundled plugin and the first-plugin
// project (all built by the tests), so its code cannot drift from code that compiles.
#include "test_prelude.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace {
std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

TEST_CASE("the README's host-API program is examples/embed_host.cpp", "[readme]") {
  const auto root = std::filesystem::path(TORCHPATCH_TEST_DATA_DIR).parent_path().parent_path();
  const auto readme = read(root / "README.md");
  const auto example = read(root / "examples" / "embed_host.cpp");
  REQUIRE(!example.empty());
  CHECK(readme.find("```cpp\n" + example + "```\n") != std::string::npos);
}

TEST_CASE("the README's plugin is the bundled custom-llama-attention source", "[readme]") {
  const auto root = std::filesystem::path(TORCHPATCH_TEST_DATA_DIR).parent_path().parent_path();
  const auto plugin = read(root / "plugins" / "custom_llama_attention" / "custom_llama_attention.cpp");
  REQUIRE(!plugin.empty());
  CHECK(read(root / "README.md").find("```cpp\n" + plugin + "```\n") != std::string::npos);
}

TEST_CASE("the README's first plugin is examples/first_plugin, source and CMakeLists", "[readme]") {
  const auto root = std::filesystem::path(TORCHPATCH_TEST_DATA_DIR).parent_path().parent_path();
  const auto readme = read(root / "README.md");
  const auto source = read(root / "examples" / "first_plugin" / "my_llama_mlp.cpp");
  const auto cmake = read(root / "examples" / "first_plugin" / "CMakeLists.txt");
  REQUIRE(!source.empty());
  REQUIRE(!cmake.empty());
  CHECK(readme.find("```cpp\n" + source + "```\n") != std::string::npos);
  CHECK(readme.find("```cmake\n" + cmake + "```\n") != std::string::npos);
}
