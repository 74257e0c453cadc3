// Plugins that crash, exit or hang are refused through the probe, without taking the host down;
// plugins anyone could swap (world-writable directories anywhere on the way, relative paths) are not
// loaded; a second host on the same registries offers what the first loaded.
#include "test_prelude.h"
#include "cli_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchpatch/json_file.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/printable.h"
#include "torchpatch/runtime/registries.h"

using Catch::Matchers::Contains;
using testutil::ScratchDir;
using testutil::torchpatch_cli;
using torchpatch::PluginHost;
using torchpatch::PluginHostOptions;
using torchpatch::PluginProbe;
using torchpatch::PluginRecord;
namespace fs = std::filesystem;

namespace {

const fs::path kTestPluginDir = TORCHPATCH_TEST_PLUGIN_DIR;

// The refusal reason of the record whose file name is `file`.
std::string reason_of(const PluginHost& host, const std::string& file) {
  for (const auto& r : host.plugins()) {
    if (r.path.filename() == file) return r.status == PluginRecord::Status::Refused ? r.reason : "(not refused)";
  }
  return "(no record)";
}

void make_world_writable(const fs::path& dir) {
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::add);
}

}  // namespace

// -- crash isolation -----------------------------------------------------------------------------------

TEST_CASE("plugins that abort, segfault or exit are refused through the probe, naming signal and phase",
          "[plugins][probe]") {
  ScratchDir cache("probe-cache");
  PluginHostOptions options;
  options.probe = PluginProbe::DropIns;
  options.probe_cache = cache.path / "plugin-probes.json";
  PluginHost host(options, torchpatch::Registries());
  host.load_directory(kTestPluginDir / "crashing");
  REQUIRE(host.plugins().size() == 4);
  CHECK_THAT(reason_of(host, "testplugin_abort_in_register.so"),
             Contains("crashed with signal 6 (SIGABRT, Aborted) during registration in its probe process") &&
                 Contains("it printed: about to die (abort-in-register)") && Contains("--no-probe"));
  CHECK_THAT(reason_of(host, "testplugin_segfault_in_register.so"),
             Contains("crashed with signal 11 (SIGSEGV, Segmentation fault) during registration"));
  CHECK_THAT(reason_of(host, "testplugin_exit_in_register.so"),
             Contains("ended its probe process with exit status 0 during registration (a plugin must not exit its "
                      "host)"));
  CHECK_THAT(reason_of(host, "testplugin_abort_in_static_init.so"),
             Contains("crashed with signal 6 (SIGABRT, Aborted) during static initialisation"));
  CHECK(host.offered_classes().empty());

  // Each outcome is kept by file identity: a second host reads them instead of forking.
  const auto cached = torchpatch::read_json_file(options.probe_cache, [](const std::string& m) { FAIL(m); });
  CHECK(cached.at("probes").size() == 4);
  PluginHost again(options, torchpatch::Registries());
  const auto start = std::chrono::steady_clock::now();
  again.load_directory(kTestPluginDir / "crashing");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("four cached refusals took " << seconds << " s");
  CHECK(reason_of(again, "testplugin_segfault_in_register.so") == reason_of(host, "testplugin_segfault_in_register.so"));
}

TEST_CASE("a plugin that outlives the probe's timeout is killed and refused", "[plugins][probe]") {
  PluginHostOptions options;
  options.probe = PluginProbe::DropIns;
  options.probe_timeout = std::chrono::milliseconds(300);
  PluginHost host(options, torchpatch::Registries());
  const auto start = std::chrono::steady_clock::now();
  host.load_directory(kTestPluginDir / "sleeping");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK_THAT(reason_of(host, "testplugin_sleep_in_register.so"),
             Contains("did not finish loading within 0.3 s in its probe process, during registration (killed)"));
}

TEST_CASE("a good plugin passes the probe and is then loaded for real", "[plugins][probe]") {
  PluginHostOptions options;
  options.probe = PluginProbe::DropIns;
  torchpatch::Registries registries;
  PluginHost host(options, registries);
  const auto record = host.load_file(kTestPluginDir / "good" / "testplugin_good.so");
  CHECK(record.status == PluginRecord::Status::Loaded);
  CHECK(registries.patches().get_patch_mapping().get("LlamaMLP"));
}

TEST_CASE("the CLI refuses crashing drop-ins and completes the command", "[plugins][probe][cli]") {
  ScratchDir cache("probe-cache-cli");
  const std::string env = "TORCHPATCH_CACHE_DIR=" + cache.path.string();
  const std::string command = "run --preset tiny-llama --prompt-ids 1,2,3 --plugin-dir " +
                              (kTestPluginDir / "crashing").string();
  for (int round = 0; round < 2; ++round) {  // probed, then from the cache
    INFO("round " << round);
    const auto r = torchpatch_cli(command, env);
    CHECK(r.code == 0);
    CHECK(testutil::count(r.out, "refused: plugin crashed with signal") == 3);
    CHECK(testutil::count(r.out, "refused: plugin ended its probe process with exit status 0") == 1);
    CHECK_THAT(r.out, Contains("row 0 next tokens at position 2"));
  }
  CHECK(fs::exists(cache.path / "plugin-probes.json"));
  // Without the probe the exit(0) plugin would end the command silently with status 0; the
  // registration-time abort takes the process down. --no-probe is the user's explicit choice.
  const auto unprobed = torchpatch_cli("plan --preset tiny-llama --no-probe --plugin-dir " +
                                       (kTestPluginDir / "crashing").string());
  CHECK(unprobed.code != 0);
  // The last line before the crash names the plugin that caused it (the first in name order).
  const std::string loading = "torchpatch: loading plugin ";
  const auto last = unprobed.out.rfind(loading);
  REQUIRE(last != std::string::npos);
  CHECK(unprobed.out.substr(last, unprobed.out.find('\n', last) - last) ==
        loading + (kTestPluginDir / "crashing" / "testplugin_abort_in_register.so").string() +
            " without a probe (--no-probe)");
}

// -- who could swap the code ---------------------------------------------------------------------------

TEST_CASE("a symbolic link to a plugin inside a world-writable directory is refused", "[plugins][permissions]") {
  ScratchDir root("ww-link");
  fs::create_directories(root.path / "open");
  fs::create_directories(root.path / "safe");
  fs::copy_file(kTestPluginDir / "good" / "testplugin_good.so", root.path / "open" / "good.so");
  make_world_writable(root.path / "open");
  fs::create_symlink(root.path / "open" / "good.so", root.path / "safe" / "good.so");
  PluginHost host(PluginHostOptions{}, torchpatch::Registries());
  host.load_directory(root.path / "safe");
  CHECK_THAT(reason_of(host, "good.so"),
             Contains("plugin directory is world-writable (" + (root.path / "open").string() +
                      ", where the file really is)"));
}

TEST_CASE("a plugin directory under a world-writable parent is refused", "[plugins][permissions]") {
  ScratchDir root("ww-parent");
  fs::create_directories(root.path / "plugins");
  fs::copy_file(kTestPluginDir / "good" / "testplugin_good.so", root.path / "plugins" / "good.so");
  make_world_writable(root.path);
  PluginHost host(PluginHostOptions{}, torchpatch::Registries());
  host.load_directory(root.path / "plugins");
  REQUIRE(host.plugins().size() == 1);
  CHECK_THAT(host.plugins()[0].reason,
             Contains("plugin directory is inside " + root.path.string() + ", which is world-writable: anyone could "
                      "rename the plugin directory away"));
  // The sticky bit (as on /tmp) stops others renaming what is not theirs: allowed.
  fs::permissions(root.path, fs::perms::sticky_bit, fs::perm_options::add);
  PluginHost sticky(PluginHostOptions{}, torchpatch::Registries());
  sticky.load_directory(root.path / "plugins");
  CHECK(sticky.plugins().at(0).status == PluginRecord::Status::Loaded);
}

TEST_CASE("relative plugin paths are refused; the CLI resolves --plugin-dir against the current directory",
          "[plugins][permissions][cli]") {
  PluginHost host(PluginHostOptions{}, torchpatch::Registries());
  host.load_path_list("good:" + (kTestPluginDir / "good").string());
  REQUIRE(host.plugins().size() == 2);
  CHECK(host.plugins()[0].status == PluginRecord::Status::Refused);
  CHECK_THAT(host.plugins()[0].reason, Contains("plugin directory is a relative path; give an absolute one"));
  CHECK(host.plugins()[1].status == PluginRecord::Status::Loaded);

  const std::string in_plugins = "cd " + kTestPluginDir.string() + " &&";
  auto r = torchpatch_cli("plugins --plugin-dir good", in_plugins);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("loaded    torchpatch-test-good 1.2.3  [drop-in]  " +
                             (kTestPluginDir / "good" / "testplugin_good.so").string()));
  r = torchpatch_cli("plugins", in_plugins + " TORCHPATCH_PLUGIN_PATH=good");
  CHECK_THAT(r.out, Contains("reason: plugin directory is a relative path"));
}

// -- hosts ---------------------------------------------------------------------------------------------

TEST_CASE("a second host on the same registries offers the classes the first loaded", "[plugins]") {
  torchpatch::Registries registries;
  const fs::path file = kTestPluginDir / "good" / "testplugin_good.so";
  PluginHost first(PluginHostOptions{}, registries);
  REQUIRE(first.load_file(file).status == PluginRecord::Status::Loaded);
  PluginHost second(PluginHostOptions{}, registries);
  const auto record = second.load_file(file);
  CHECK(record.status == PluginRecord::Status::Loaded);
  CHECK_THAT(record.reason, Contains("loaded once into these registries"));
  CHECK(second.find_class("CountingLlamaMLP"));
  CHECK(second.offered_classes().size() == first.offered_classes().size());
  // Within one host, the same file twice is a duplicate.
  CHECK(second.load_file(file).status == PluginRecord::Status::Duplicate);

  // A host with patches of its own gets the drop-in keys into them.
  auto own = registries.with_own_patches();
  PluginHost third(PluginHostOptions{}, own);
  CHECK(third.load_file(file).status == PluginRecord::Status::Loaded);
  CHECK(own.patches().get_patch_mapping().get("LlamaMLP"));
}

TEST_CASE("a plugin first loaded as a catalogue is a drop-in for the next host, under its conflict checks",
          "[plugins]") {
  torchpatch::Registries registries;
  const fs::path good = kTestPluginDir / "good" / "testplugin_good.so";
  PluginHost catalogue(PluginHostOptions{}, registries.with_own_patches());
  REQUIRE(catalogue.load_file(good, torchpatch::PluginMode::Catalogue).status == PluginRecord::Status::Loaded);
  CHECK_FALSE(catalogue.registries().patches().get_patch_mapping().get("LlamaMLP"));

  auto own = registries.with_own_patches();
  PluginHost dropin(PluginHostOptions{}, own);
  CHECK(dropin.load_file(good).status == PluginRecord::Status::Loaded);
  const auto mapping = own.patches().get_patch_mapping();
  const auto* patch = mapping.get("LlamaMLP");
  REQUIRE(patch);
  CHECK(patch->name == "CountingLlamaMLP");

  // A host that has a drop-in for LlamaMLP already refuses the adopted one with the usual conflict.
  auto other = registries.with_own_patches();
  PluginHost conflicting(PluginHostOptions{}, other);
  REQUIRE(conflicting.load_file(kTestPluginDir / "conflict" / "testplugin_conflict_a.so").status ==
          PluginRecord::Status::Loaded);
  const auto refused = conflicting.load_file(good);
  CHECK(refused.status == PluginRecord::Status::Refused);
  CHECK_THAT(refused.reason, Contains("key 'LlamaMLP' conflicts"));
  const auto kept = other.patches().get_patch_mapping();
  CHECK(kept.get("LlamaMLP")->name == "ConflictMlpA");
  CHECK_FALSE(conflicting.find_class("CountingLlamaMLP"));
}

// -- terminal safety -----------------------------------------------------------------------------------

TEST_CASE("names are escaped before they reach a terminal", "[hardening][printable]") {
  CHECK(torchpatch::printable("plain.name-1") == "plain.name-1");
  CHECK(torchpatch::printable("a\x1b[2Jb") == "a\\x1B[2Jb");
  CHECK(torchpatch::printable("line\nforged [bundled]") == "line\\nforged [bundled]");
  CHECK(torchpatch::printable("back\\slash") == "back\\slash");  // patterns read as written
  CHECK(torchpatch::printable("caf\xc3\xa9 \xe4\xb8\xad") == "caf\xc3\xa9 \xe4\xb8\xad");  // UTF-8 kept
  CHECK(torchpatch::printable("\xc2\x9b" "31m") == "\\xC2\\x9B31m");  // C1 CSI
  CHECK(torchpatch::printable("bad\xff\xc3") == "bad\\xFF\\xC3");
}

// -- threads ------------------------------------------------------------------------------------------

TEST_CASE("stress: hosts on their own and on shared registries load plugins from 4 threads at once",
          "[plugins][threads][stress]") {
  const fs::path good = kTestPluginDir / "good" / "testplugin_good.so";
  const fs::path toy = kTestPluginDir / "toy_family" / "testplugin_toy_family.so";
  torchpatch::Registries shared;
  std::atomic<int> loaded{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8; ++round) {
        torchpatch::Registries own;
        PluginHost host(PluginHostOptions{}, round % 2 ? shared.with_own_patches() : own);
        for (const auto& file : {good, toy}) {
          const auto status = host.load_file(file).status;
          if (status == PluginRecord::Status::Loaded) ++loaded;
          else ++failures;
        }
        // Build while other threads register: the family and the patch must be there, whole.
        if (!host.registries().families().find("toy")) ++failures;
        if (t == 0) (void)host.registries().patches().get_patch_mapping();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures == 0);
  CHECK(loaded == 4 * 8 * 2);
}
