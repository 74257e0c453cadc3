// Where the tests find their data, plugins and the CLI: absolute paths of this checkout and build,
// defined in one generated file (tests/CMakeLists.txt) rather than on every file's command line, so
// that the test files compile alike in every clone and ccache serves them from one clone to the next.
#pragma once

namespace testpaths {
extern const char* const kDataDir;            // tests/data
extern const char* const kModelsDir;          // the real checkpoints (scripts/install-test-models.sh)
extern const char* const kTestPluginDir;      // the test plugins, one folder per scenario
extern const char* const kBundledPluginDir;   // the bundled plugins
extern const char* const kCli;                // the torchpatch CLI
}  // namespace testpaths

#define TORCHPATCH_TEST_DATA_DIR testpaths::kDataDir
#define TORCHPATCH_TEST_MODELS_DIR testpaths::kModelsDir
#define TORCHPATCH_TEST_PLUGIN_DIR testpaths::kTestPluginDir
#define TORCHPATCH_BUNDLED_PLUGIN_DIR testpaths::kBundledPluginDir
#define TORCHPATCH_CLI testpaths::kCli
