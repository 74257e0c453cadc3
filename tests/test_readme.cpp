// The README and docs/plugins.md show real files verbatim: the host-API example (README), the
// first-plugin project and the bundled plugin (docs/plugins.md), all built by the tests, so their code
// cannot drift from code that compiles.
#include "test_prelude.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace {
std::filesystem::path source_root() {
  return std::filesystem::path(TORCHPATCH_TEST_DATA_DIR).parent_path().parent_path();
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether `doc` holds `file`'s text verbatim as a whole fenced block of `language`.
bool shows_verbatim(const std::string& doc, const std::string& language, const std::string& file) {
  return doc.find("```" + language + "\n" + file + "```\n") != std::string::npos;
}
}  // namespace

TEST_CASE("the README's host project is examples/embed_host, source and CMakeLists", "[readme]") {
  const auto root = source_root();
  const auto readme = read(root / "README.md");
  const auto source = read(root / "examples" / "embed_host" / "embed_host.cpp");
  const auto cmake = read(root / "examples" / "embed_host" / "CMakeLists.txt");
  REQUIRE(!source.empty());
  REQUIRE(!cmake.empty());
  CHECK(shows_verbatim(readme, "cpp", source));
  CHECK(shows_verbatim(readme, "cmake", cmake));
}

TEST_CASE("docs/plugins.md's built-in subclass is the bundled custom-llama-attention source", "[readme]") {
  const auto root = source_root();
  const auto plugin = read(root / "plugins" / "custom_llama_attention" / "custom_llama_attention.cpp");
  REQUIRE(!plugin.empty());
  CHECK(shows_verbatim(read(root / "docs" / "plugins.md"), "cpp", plugin));
}

TEST_CASE("docs/plugins.md's first plugin is examples/first_plugin, source and CMakeLists", "[readme]") {
  const auto root = source_root();
  const auto doc = read(root / "docs" / "plugins.md");
  const auto source = read(root / "examples" / "first_plugin" / "my_llama_mlp.cpp");
  const auto cmake = read(root / "examples" / "first_plugin" / "CMakeLists.txt");
  REQUIRE(!source.empty());
  REQUIRE(!cmake.empty());
  CHECK(shows_verbatim(doc, "cpp", source));
  CHECK(shows_verbatim(doc, "cmake", cmake));
}
