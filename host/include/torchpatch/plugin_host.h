// The plugin host: finds plugin shared objects, checks their descriptors, calls their register
// functions and puts what they offer into a patch registry (drop-in) or a catalogue (by name).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sys/types.h>
#include <string>
#include <vector>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/models/family.h"
#include "torchpatch/patching/module_class.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/runtime/registries.h"

struct stat;

struct TorchpatchPluginDescriptor;  // plugin_descriptor.h

namespace torchpatch {

struct LoadedIdentity;  // plugin_host.cpp: a file loaded into a set of registries

/// How a plugin's replacements are used once loaded.
enum class PluginMode {
  DropIn,     ///< registered under the keys they declare
  Catalogue,  ///< only offered by class name (the bundled plugins)
};

/// A class a plugin offers.
struct OfferedClass {
  std::string name;
  std::string role;
  std::vector<std::string> keys;  ///< keys the plugin declares for it
};

/// What happened to one plugin file.
struct PluginRecord {
  enum class Status { Loaded, Refused, Duplicate };
  std::filesystem::path path;
  std::string name;     ///< from the descriptor (empty when it could not be read)
  std::string version;
  Status status = Status::Refused;
  std::string reason;   ///< why it was refused or skipped as a duplicate
  PluginMode mode = PluginMode::DropIn;
  std::vector<OfferedClass> classes;
  std::vector<std::string> conversions;  ///< keys of the conversion rules it registered
  std::vector<std::string> families;     ///< model types of the families it added

  /// "loaded", "refused" or "duplicate".
  const char* status_name() const;
};

/// What a plugin's register function offered, as the host collects it.
struct RegistrarOffer {
  std::vector<std::string> keys;
  ModuleClass cls;
};
using RegistrarConversion = std::pair<std::string, checkpoint::ConversionFactory>;

/// Which plugins are first loaded in a short-lived child process (see PluginHostOptions::probe).
enum class PluginProbe {
  Off,      ///< none
  DropIns,  ///< plugins loaded as drop-ins (the CLI's default)
  All,      ///< the bundled (catalogue) plugins too
};

struct PluginHostOptions {
  /// A refused plugin throws PluginError instead of being skipped.
  bool strict = false;
  /// Load plugin files or directories that anyone may write to, or that sit in directories anyone may
  /// rename (a world-writable directory without the sticky bit anywhere above them).
  bool allow_world_writable = false;
  /// Crash isolation: a plugin is loaded in a forked child first; one that dies there (a signal, an
  /// exit of its own, no end within `probe_timeout`) is refused with the signal or status and the
  /// phase (static initialisation, descriptor, registration), and never loaded into this process.
  PluginProbe probe = PluginProbe::Off;
  /// Where probe outcomes are kept by file identity (empty: not kept); see default_probe_cache().
  std::filesystem::path probe_cache;
  std::chrono::milliseconds probe_timeout{10000};
  /// Called with a drop-in plugin's file just before its code first runs in this process without a
  /// probe (`probe` off): should it crash the process, the last line printed names it. The CLI prints
  /// "loading plugin FILE without a probe" with --no-probe.
  std::function<void(const std::filesystem::path& file)> before_unprobed_load;
};

/// Loads plugins into `registries` (the process-wide ones by default): their patches, conversions and
/// families. Two hosts with registries of their own share nothing; one library loaded by both
/// registers into each. Libraries are never unloaded: objects their code made may outlive any handle,
/// so they stay mapped until the process exits.
class PluginHost {
 public:
  explicit PluginHost(PluginHostOptions options = {}, Registries registries = default_registries());
  ~PluginHost();
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  /// Loads every `*.so` in `dir` (sorted by name). A missing directory is recorded as refused, and so
  /// is a relative path: plugin paths are absolute (the CLI resolves --plugin-dir against the current
  /// directory and says so), or the current directory would decide what code runs.
  void load_directory(const std::filesystem::path& dir, PluginMode mode = PluginMode::DropIn);
  /// Loads one plugin file; returns its record (refused, with the reason, on any failure). A file this
  /// host loaded before is a duplicate; one another host loaded into the same registries is not
  /// loaded again, but its classes are offered here too and its drop-in keys go into this host's patches.
  PluginRecord load_file(const std::filesystem::path& file, PluginMode mode = PluginMode::DropIn);
  /// Loads the directories of a colon-separated path list (e.g. $TORCHPATCH_PLUGIN_PATH) as drop-ins;
  /// relative entries are refused.
  void load_path_list(const std::string& paths);

  /// Every file seen, in load order.
  const std::vector<PluginRecord>& plugins() const { return records_; }
  std::vector<PluginRecord> refused() const;

  /// A class offered by a loaded plugin, or a built-in class, by name.
  std::optional<ModuleClass> find_class(const std::string& name) const;
  /// Classes offered by loaded plugins, in load order.
  const std::vector<ModuleClass>& offered_classes() const { return classes_; }

  /// Registers class `class_name` (offered or built in) under `key`: the explicit choice that
  /// resolves conflicts (`--patch KEY=CLASS`). Throws PatchError for an unknown class.
  void patch(const std::string& key, const std::string& class_name, bool overwrite = true);

  /// The registries this host loads into.
  const Registries& registries() const { return registries_; }

 private:
  PluginRecord& refuse(PluginRecord& record, std::string reason);
  PluginRecord load_locked(const std::filesystem::path& file, PluginMode mode);
  /// Whether plugins loaded in `mode` are tried in a child process first (PluginHostOptions::probe).
  bool probed(PluginMode mode) const;
  std::optional<std::string> probe(const std::filesystem::path& file, const struct ::stat& st, PluginMode mode);
  std::optional<std::string> adopt(const LoadedIdentity& loaded, PluginRecord& record, std::size_t index);
  // The stages of load_file; each returns why the plugin is refused, or nullopt.
  std::optional<std::string> dropin_conflict(const std::string& key, const Origin& origin) const;
  std::optional<std::string> check_file(const std::filesystem::path& file, struct ::stat& st) const;
  std::optional<std::string> check_descriptor(const TorchpatchPluginDescriptor* d, PluginRecord& record) const;
  std::optional<std::string> check_offers(std::vector<RegistrarOffer>& offers, PluginMode mode, const Origin& origin,
                                          PatchMapping::Items& items, std::vector<OfferedClass>& offered) const;
  std::optional<std::string> check_conversions(std::vector<RegistrarConversion>& all, PluginMode mode,
                                               const std::vector<OfferedClass>& offered,
                                               std::vector<RegistrarConversion>& kept) const;
  std::optional<std::string> register_all(const PatchMapping::Items& items,
                                          const std::vector<RegistrarConversion>& conversions,
                                          std::vector<Family>& families, std::vector<QuantizationMethod>& methods,
                                          const Origin& origin, PluginRecord& record);
  void refuse_path(const std::filesystem::path& path, PluginMode mode, std::string reason);
  PluginHostOptions options_;
  Registries registries_;
  std::vector<PluginRecord> records_;
  std::vector<ModuleClass> classes_;
  std::vector<std::pair<std::string, std::size_t>> dropin_keys_;  // key -> index into records_
  std::vector<std::pair<dev_t, ino_t>> loaded_here_;             // files this host loaded or adopted
  int probe_fd_ = -1;  // in a probe child: where the phases go
};

/// The probe cache of the current user: `$TORCHPATCH_CACHE_DIR/plugin-probes.json`, else under
/// `$XDG_CACHE_HOME/torchpatch` or `~/.cache/torchpatch`; empty when none of them is set.
std::filesystem::path default_probe_cache();

/// The bundled plugins of the libtorchpatch_host this program runs on: `torchpatch/plugins` beside
/// the library (`<prefix>/lib/torchpatch/plugins` for an installed package, `build/lib/...` in a
/// build tree), whichever program or directory the host runs from.
std::filesystem::path bundled_plugin_dir();

}  // namespace torchpatch
