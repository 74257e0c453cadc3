#include "torchpatch/plugin_host.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include <boost/dll/shared_library.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/version.h>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"
#include "torchpatch/patching/build.h"
#include "torchpatch/plugin_api.h"
#include "plugin_probe.h"

namespace torchpatch {

namespace fs = std::filesystem;

namespace {

// Libraries stay loaded until the process exits; the list itself is deliberately never destroyed,
// so no destructor order at exit can unload a library whose code is still referenced.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  return *libraries;
}

}  // namespace

// A file loaded into one set of registries (one load per file and name into each family registry:
// registries of their own get their own registrations from the same library; handles that share
// families, as with_own_patches() does, share the loaded plugins too), with what it offered, so that
// another host on the same registries can offer it without running its code again.
struct LoadedIdentity {
  dev_t device;
  ino_t inode;
  PluginRecord record;
  std::vector<ModuleClass> classes;
};

namespace {

std::vector<LoadedIdentity>& loaded_identities(const Registries& registries) {
  // Holding the handles keeps registries that plugin code went into alive as long as the libraries.
  static auto* identities = new std::vector<std::pair<Registries, std::vector<LoadedIdentity>>>();
  for (auto& [held, list] : *identities) {
    if (&held.families() == &registries.families()) return list;
  }
  return identities->emplace_back(registries, std::vector<LoadedIdentity>()).second;
}
std::mutex& load_mutex() {
  static std::mutex mutex;
  return mutex;
}

class CollectingRegistrar : public Registrar {
 public:
  void add_replacement(ModuleClass cls, const std::vector<std::string>& keys) override {
    offers.push_back({keys, std::move(cls)});
  }
  void add_family(Family family) override { families.push_back(std::move(family)); }
  void add_quantization_method(QuantizationMethod method) override { methods.push_back(std::move(method)); }
  void add_conversion(const std::string& key, checkpoint::ConversionFactory rules) override {
    conversions.emplace_back(key, std::move(rules));
  }
  std::vector<RegistrarOffer> offers;
  std::vector<RegistrarConversion> conversions;
  std::vector<Family> families;
  std::vector<QuantizationMethod> methods;
};

std::string safe_string(const char* s) { return s ? std::string(s) : std::string("(null)"); }

bool world_writable(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IWOTH);
}

// A directory anyone may rename entries of: world-writable without the sticky bit (with it, as in
// /tmp, only an entry's owner may rename it).
bool renamable_by_anyone(const fs::path& dir) {
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX);
}

// The first directory above `dir` (itself excluded) through which anyone could swap `dir` for
// another: checked along the path as given and along its real path (symbolic links resolved).
std::optional<fs::path> exposed_ancestor(const fs::path& dir) {
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  for (const fs::path& start : {dir, ec ? dir : real}) {
    for (fs::path p = start.parent_path(); !p.empty(); p = p.parent_path()) {
      if (renamable_by_anyone(p)) return p;
      if (p == p.root_path()) break;
    }
  }
  return std::nullopt;
}

constexpr const char* kWorldWritableOverride = "(allow_world_writable / --allow-world-writable overrides)";

}  // namespace

const char* PluginRecord::status_name() const {
  switch (status) {
    case Status::Loaded: return "loaded";
    case Status::Refused: return "refused";
    case Status::Duplicate: return "duplicate";
  }
  return "?";
}

PluginHost::PluginHost(PluginHostOptions options, Registries registries)
    : options_(options), registries_(std::move(registries)) {}

PluginHost::~PluginHost() = default;

PluginRecord& PluginHost::refuse(PluginRecord& record, std::string reason) {
  record.status = PluginRecord::Status::Refused;
  record.reason = std::move(reason);
  if (options_.strict) {
    throw PluginError(fmt::format("plugin {}: {}", record.path.string(), record.reason));
  }
  return record;
}

void PluginHost::refuse_path(const fs::path& path, PluginMode mode, std::string reason) {
  PluginRecord record;
  record.path = path;
  record.mode = mode;
  records_.push_back(record);
  refuse(records_.back(), std::move(reason));
}

void PluginHost::load_directory(const fs::path& dir, PluginMode mode) {
  if (dir.is_relative()) {
    return refuse_path(dir, mode, "plugin directory is a relative path; give an absolute one (relative to the "
                                  "current directory, what it loads would depend on where the command runs)");
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return refuse_path(dir, mode, "plugin directory does not exist or is not a directory");
  }
  if (!options_.allow_world_writable) {
    if (world_writable(dir)) {
      return refuse_path(dir, mode, fmt::format("plugin directory is world-writable; refusing to load from it {}",
                                                kWorldWritableOverride));
    }
    if (const auto above = exposed_ancestor(dir)) {
      return refuse_path(dir, mode, fmt::format("plugin directory is inside {}, which is world-writable: anyone could "
                                                "rename the plugin directory away and put another in its place; "
                                                "refusing to load from it {}",
                                                above->string(), kWorldWritableOverride));
    }
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".so") files.push_back(it->path());
  }
  if (ec) return refuse_path(dir, mode, "cannot list plugin directory: " + ec.message());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) load_file(file, mode);
}

void PluginHost::load_path_list(const std::string& paths) {
  std::size_t start = 0;
  while (start <= paths.size()) {
    const std::size_t end = std::min(paths.find(':', start), paths.size());
    const std::string dir = paths.substr(start, end - start);
    if (!dir.empty()) load_directory(dir, PluginMode::DropIn);
    start = end + 1;
  }
}

// Loading runs in stages; each returns why the plugin is refused, or nothing to go on.

std::optional<std::string> PluginHost::check_file(const fs::path& file, struct ::stat& st) const {
  if (file.is_relative()) return std::string("plugin path is relative; give an absolute one");
  if (::stat(file.c_str(), &st) != 0) {
    return errno == ELOOP ? std::string("too many levels of symbolic links (a link loop?)")
                          : errno == ENOENT ? std::string("no such file") : fmt::format("cannot stat: {}", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return std::string("not a regular file");
  if (options_.allow_world_writable) return std::nullopt;
  if (st.st_mode & S_IWOTH) {
    return fmt::format("plugin file is world-writable; refusing to load it {}", kWorldWritableOverride);
  }
  std::error_code ec;
  const fs::path real = fs::canonical(file, ec);
  for (const fs::path& dir : {file.parent_path(), ec ? file.parent_path() : real.parent_path()}) {
    // The file's own directory: world-writable at all lets anyone add or (without the sticky bit)
    // swap files; sticky, the file must be ours or root's.
    struct stat ds {};
    const bool sticky = ::stat(dir.c_str(), &ds) == 0 && (ds.st_mode & S_ISVTX);
    if (world_writable(dir) && (!sticky || (st.st_uid != ::geteuid() && st.st_uid != 0))) {
      return fmt::format("plugin directory is world-writable{}; refusing to load it {}",
                         dir == file.parent_path() ? "" : fmt::format(" ({}, where the file really is)", dir.string()),
                         kWorldWritableOverride);
    }
    if (const auto above = exposed_ancestor(dir)) {
      return fmt::format("plugin file is under {}, which is world-writable: anyone could rename a directory on the "
                         "way away and put another in its place; refusing to load it {}",
                         above->string(), kWorldWritableOverride);
    }
  }
  return std::nullopt;
}

std::optional<std::string> PluginHost::check_descriptor(const TorchpatchPluginDescriptor* d, PluginRecord& record) const {
  if (!d) return std::string("descriptor entry point returned null");
  if (d->abi_version != TORCHPATCH_PLUGIN_ABI_VERSION) {
    return fmt::format("plugin ABI version {}, but this host speaks version {}; rebuild the plugin against this "
                       "torchpatch",
                       d->abi_version, TORCHPATCH_PLUGIN_ABI_VERSION);
  }
  if (d->struct_size < sizeof(TorchpatchPluginDescriptor)) {
    return fmt::format("descriptor is {} bytes, expected at least {}", d->struct_size, sizeof(TorchpatchPluginDescriptor));
  }
  record.name = safe_string(d->name);
  record.version = safe_string(d->version);
  if (d->torch_major != TORCH_VERSION_MAJOR || d->torch_minor != TORCH_VERSION_MINOR ||
      d->torch_patch != TORCH_VERSION_PATCH) {
    return fmt::format("plugin '{}' was built against LibTorch {}.{}.{}, but this host runs LibTorch {}.{}.{}",
                       record.name, d->torch_major, d->torch_minor, d->torch_patch, TORCH_VERSION_MAJOR,
                       TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
  }
  if (d->cxx11_abi != _GLIBCXX_USE_CXX11_ABI) {
    return fmt::format("plugin '{}' was built with _GLIBCXX_USE_CXX11_ABI={}, this host with {}", record.name,
                       d->cxx11_abi, _GLIBCXX_USE_CXX11_ABI);
  }
  const bool compatible = d->torchpatch_major == TORCHPATCH_VERSION_MAJOR &&
                          (TORCHPATCH_VERSION_MAJOR > 0 || d->torchpatch_minor == TORCHPATCH_VERSION_MINOR);
  if (!compatible) {
    return fmt::format("plugin '{}' was built against torchpatch {}.{}.{}, but this host is torchpatch {}.{}.{}; "
                       "rebuild the plugin against this torchpatch",
                       record.name, d->torchpatch_major, d->torchpatch_minor, d->torchpatch_patch,
                       TORCHPATCH_VERSION_MAJOR, TORCHPATCH_VERSION_MINOR, TORCHPATCH_VERSION_PATCH);
  }
  return std::nullopt;
}

std::optional<std::string> PluginHost::dropin_conflict(const std::string& key, const Origin& origin) const {
  for (const auto& [other_key, other] : dropin_keys_) {
    if (other_key != key) continue;
    const auto& o = records_[other];
    return fmt::format("key '{}' conflicts: plugin '{}' ({}) and plugin '{}' ({}) both declare it; choose one "
                       "with --patch {}=CLASS",
                       key, o.name, o.path.string(), origin.plugin, origin.file, key);
  }
  return std::nullopt;
}

std::optional<std::string> PluginHost::check_offers(std::vector<RegistrarOffer>& offers, PluginMode mode,
                                                    const Origin& origin, PatchMapping::Items& items,
                                                    std::vector<OfferedClass>& offered) const {
  for (auto& offer : offers) {
    offer.cls.origin = origin;
    if (!offer.cls.factory) return fmt::format("class '{}' has no factory", offer.cls.name);
    if (offer.cls.name.empty()) return std::string("a replacement class has no name");
    for (const auto& earlier : offered) {
      if (earlier.name == offer.cls.name) return fmt::format("class '{}' is offered twice", offer.cls.name);
    }
    if (auto existing = find_class(offer.cls.name)) {
      return fmt::format("class '{}' is already offered by {}", offer.cls.name, existing->origin.describe());
    }
    for (const auto& key : offer.keys) {
      const std::string expected = registries_.classes().role_of(key);
      if (!expected.empty() && expected != offer.cls.role) {
        return fmt::format("class '{}' has role {}, but its key '{}' is a patch point of role {}", offer.cls.name,
                           offer.cls.role, key, expected);
      }
      try {
        PatchMapping({{key, offer.cls}}, false, &registries_.classes());  // validates the key as a regular expression in either mode
      } catch (const Error& e) {
        return std::string(e.what());
      }
      if (mode != PluginMode::DropIn) continue;
      if (auto conflict = dropin_conflict(key, origin)) return conflict;
      items.emplace_back(key, offer.cls);
    }
    offered.push_back({offer.cls.name, offer.cls.role, offer.keys});
  }
  return std::nullopt;
}

std::optional<std::string> PluginHost::check_conversions(std::vector<RegistrarConversion>& all, PluginMode mode,
                                                         const std::vector<OfferedClass>& offered,
                                                         std::vector<RegistrarConversion>& kept) const {
  // Conversions keyed by the plugin's own classes apply only where those classes are used; others
  // (a model type, say) change loading everywhere, so a catalogue plugin does not register them:
  // that is refused, not dropped, so the plugin's author hears of it.
  for (auto& conversion : all) {
    const std::string& key = conversion.first;  // not a structured binding: the lambda captures it
    auto& rules = conversion.second;
    const bool own_class = std::any_of(offered.begin(), offered.end(), [&](const auto& c) { return c.name == key; });
    if (mode == PluginMode::Catalogue && !own_class) {
      return fmt::format("conversion rules for '{}', which is not a class of this plugin: a bundled (catalogue) "
                         "plugin may only convert its own classes' weights",
                         key);
    }
    if (!rules) return fmt::format("conversion rules for '{}' are empty", key);
    if (auto holder = registries_.conversions().origin(key)) {
      return fmt::format("conversion mapping for '{}' conflicts: already registered by {}", key, holder->describe());
    }
    kept.emplace_back(key, std::move(rules));
  }
  return std::nullopt;
}

std::optional<std::string> PluginHost::register_all(const PatchMapping::Items& items,
                                                    const std::vector<RegistrarConversion>& conversions,
                                                    std::vector<Family>& families,
                                                    std::vector<QuantizationMethod>& methods, const Origin& origin,
                                                    PluginRecord& record) {
  std::vector<std::string> keys;
  for (const auto& item : items) keys.push_back(item.first);
  auto take_back = [&] {
    for (const auto& key : record.conversions) registries_.conversions().remove(key);
    record.conversions.clear();
    if (!keys.empty()) registries_.patches().unregister_patch_mapping(keys);
  };
  if (!items.empty()) {
    try {
      registries_.patches().register_patch_mapping(items, /*overwrite=*/false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
  }
  for (const auto& [key, rules] : conversions) {
    try {
      registries_.conversions().add(key, rules, false, origin);
    } catch (const Error& e) {  // registered by someone else meanwhile: take back what this plugin added
      take_back();
      return std::string(e.what());
    }
    record.conversions.push_back(key);
  }
  // Families and quantization methods last: they cannot be taken back, so everything else must have
  // gone in first. A method's name is checked before any family goes in.
  for (const auto& method : methods) {
    if (auto held = registries_.families().quantization_method(method.name)) {
      take_back();
      return fmt::format("quantization method '{}' is already provided by {}", method.name, held->origin.describe());
    }
  }
  for (auto& family : families) {
    family.origin = origin;
    const std::string model_type = family.model_type;
    try {
      registries_.families().add(std::move(family));
    } catch (const Error& e) {
      take_back();
      return std::string(e.what());
    }
    record.families.push_back(model_type);
  }
  for (auto& method : methods) {
    method.origin = origin;
    registries_.families().add_quantization_method(std::move(method));
  }
  return std::nullopt;
}

PluginRecord PluginHost::load_file(const fs::path& file, PluginMode mode) {
  std::lock_guard<std::mutex> lock(load_mutex());
  return load_locked(file, mode);
}

bool PluginHost::probed(PluginMode mode) const {
  return options_.probe == PluginProbe::All || (options_.probe == PluginProbe::DropIns && mode == PluginMode::DropIn);
}

std::optional<std::string> PluginHost::probe(const fs::path& file, const struct ::stat& st, PluginMode mode) {
  if (!probed(mode) || probe_fd_ >= 0) return std::nullopt;
  probe::Cache cache(options_.probe_cache);
  const std::string key = probe::Cache::key(st);
  auto outcome = cache.find(key);
  if (!outcome) {
    outcome = probe::run_in_child(
        [&](int fd) {
          // A fresh host on fresh registries: the whole load runs, and nothing of it comes back.
          PluginHostOptions options;
          options.allow_world_writable = true;  // checked already
          PluginHost child(options, Registries());
          child.probe_fd_ = fd;
          child.load_locked(file, mode);
        },
        options_.probe_timeout);
    cache.store(key, file, *outcome);
  }
  if (outcome->passed) return std::nullopt;
  return fmt::format("plugin {}; not loaded (--no-probe skips the probe)", outcome->reason);
}

std::optional<std::string> PluginHost::adopt(const LoadedIdentity& loaded, PluginRecord& record, std::size_t index) {
  // Loaded by another host into these registries: its classes, conversions and families are in
  // already. This host offers its classes too and, as a drop-in, puts the keys they declare into its
  // own patches, under the checks of a first load (whichever mode the first host loaded it in).
  const Origin origin = loaded.classes.empty() ? Origin{} : loaded.classes.front().origin;
  PatchMapping::Items items;
  for (const auto& cls : loaded.classes) {
    if (auto existing = find_class(cls.name)) {
      return fmt::format("class '{}' is already offered by {}", cls.name, existing->origin.describe());
    }
    if (record.mode != PluginMode::DropIn) continue;
    for (const auto& offered : loaded.record.classes) {
      if (offered.name != cls.name) continue;
      for (const auto& key : offered.keys) {
        if (auto conflict = dropin_conflict(key, origin)) return conflict;
        items.emplace_back(key, cls);
      }
    }
  }
  const auto mapping = registries_.patches().get_patch_mapping();
  PatchMapping::Items missing;
  for (const auto& item : items) {
    const auto present = mapping.get(item.first);
    if (!present || present->origin.file != item.second.origin.file) missing.push_back(item);
  }
  if (!missing.empty()) {
    try {
      registries_.patches().register_patch_mapping(missing, /*overwrite=*/false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
  }
  const auto path = record.path;
  const auto mode = record.mode;
  record = loaded.record;
  record.path = path;
  record.mode = mode;
  record.reason = fmt::format("loaded once into these registries (from {}); offered by this host too",
                              loaded.record.path.string());
  classes_.insert(classes_.end(), loaded.classes.begin(), loaded.classes.end());
  for (const auto& item : items) dropin_keys_.emplace_back(item.first, index);
  return std::nullopt;
}

PluginRecord PluginHost::load_locked(const fs::path& file, PluginMode mode) {
  records_.push_back(PluginRecord{});
  const std::size_t index = records_.size() - 1;
  PluginRecord& record = records_.back();
  record.path = file;
  record.mode = mode;

  // -- the file itself: a regular file nobody else may write, not one already loaded
  struct stat st {};
  if (auto refusal = check_file(file, st)) return refuse(record, *refusal);
  for (const auto& [device, inode] : loaded_here_) {
    if (device != st.st_dev || inode != st.st_ino) continue;
    record.status = PluginRecord::Status::Duplicate;
    record.reason = "same file as one this host loaded already";
    for (const auto& r : records_) {
      if (std::error_code ec; &r != &record && r.status == PluginRecord::Status::Loaded && fs::equivalent(r.path, file, ec)) {
        record.name = r.name;
        record.reason = fmt::format("same file as {}, already loaded", r.path.string());
      }
    }
    return record;
  }
  auto& identities = loaded_identities(registries_);
  for (const auto& loaded : identities) {
    if (loaded.device != st.st_dev || loaded.inode != st.st_ino) continue;
    if (auto refusal = adopt(loaded, record, index)) return refuse(record, *refusal);
    loaded_here_.emplace_back(st.st_dev, st.st_ino);
    return record;
  }
  if (auto refusal = probe(file, st, mode)) return refuse(record, *refusal);
  if (!probed(mode) && mode == PluginMode::DropIn && probe_fd_ < 0 && options_.before_unprobed_load) {
    options_.before_unprobed_load(file);
  }

  // -- load and check the descriptor before anything C++ crosses the boundary
  boost::dll::shared_library library;
  probe::mark(probe_fd_, probe::Phase::kStaticInit);
  try {
    library.load(boost::dll::fs::path(file.string()), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return refuse(record, fmt::format("not a loadable shared object: {}", e.what()));
  }
  if (!library.has(TORCHPATCH_DESCRIPTOR_SYMBOL)) {
    return refuse(record, fmt::format("missing entry point '{}': not a torchpatch plugin (declare it with "
                                      "TORCHPATCH_PLUGIN)",
                                      TORCHPATCH_DESCRIPTOR_SYMBOL));
  }
  probe::mark(probe_fd_, probe::Phase::kDescriptor);
  auto describe = library.get_alias<const TorchpatchPluginDescriptor*()>(TORCHPATCH_DESCRIPTOR_SYMBOL);
  if (auto refusal = check_descriptor(describe(), record)) return refuse(record, *refusal);
  for (const auto& loaded : identities) {
    if (loaded.record.name == record.name) {
      record.status = PluginRecord::Status::Duplicate;
      record.reason = fmt::format("plugin '{}' is already loaded from {}", record.name, loaded.record.path.string());
      return record;
    }
  }
  if (!library.has(TORCHPATCH_REGISTER_SYMBOL)) {
    return refuse(record, fmt::format("missing entry point '{}'", TORCHPATCH_REGISTER_SYMBOL));
  }

  // -- register: collect everything, apply all or nothing. From here on the plugin's code has run, so
  // its library stays loaded even if the plugin is refused (it may have left pointers into itself).
  loaded_libraries().push_back(library);
  CollectingRegistrar registrar;
  probe::mark(probe_fd_, probe::Phase::kRegistration);
  try {
    library.get_alias<void(Registrar&)>(TORCHPATCH_REGISTER_SYMBOL)(registrar);
  } catch (const std::exception& e) {
    return refuse(record, fmt::format("register function threw: {}", e.what()));
  } catch (...) {
    return refuse(record, "register function threw a non-standard exception");
  }
  const Origin origin{record.name, record.version, file.string()};
  PatchMapping::Items items;
  std::vector<OfferedClass> offered;
  std::vector<RegistrarConversion> conversions;
  if (auto refusal = check_offers(registrar.offers, mode, origin, items, offered)) return refuse(record, *refusal);
  if (auto refusal = check_conversions(registrar.conversions, mode, offered, conversions)) {
    return refuse(record, *refusal);
  }
  if (auto refusal = register_all(items, conversions, registrar.families, registrar.methods, origin, record)) {
    return refuse(record, *refusal);
  }

  // -- accepted
  std::vector<ModuleClass> classes;
  for (const auto& offer : registrar.offers) classes.push_back(offer.cls);
  classes_.insert(classes_.end(), classes.begin(), classes.end());
  if (mode == PluginMode::DropIn) {
    for (const auto& item : items) dropin_keys_.emplace_back(item.first, index);
  }
  record.classes = std::move(offered);
  record.status = PluginRecord::Status::Loaded;
  loaded_here_.emplace_back(st.st_dev, st.st_ino);
  identities.push_back({st.st_dev, st.st_ino, record, std::move(classes)});
  return record;
}

std::vector<PluginRecord> PluginHost::refused() const {
  std::vector<PluginRecord> out;
  for (const auto& r : records_) {
    if (r.status == PluginRecord::Status::Refused) out.push_back(r);
  }
  return out;
}

std::optional<ModuleClass> PluginHost::find_class(const std::string& name) const {
  for (const auto& cls : classes_) {
    if (cls.name == name) return cls;
  }
  return registries_.classes().find(name);
}

void PluginHost::patch(const std::string& key, const std::string& class_name, bool overwrite) {
  auto cls = find_class(class_name);
  if (!cls) {
    std::vector<std::string> names;
    for (const auto& c : classes_) names.push_back(c.name);
    throw PatchError(fmt::format("--patch {}={}: no class named '{}' (offered by plugins: {})", key, class_name,
                                 class_name, names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
  }
  registries_.patches().register_patch_mapping({{key, *cls}}, overwrite);
}

fs::path default_probe_cache() {
  const auto dir = [](const char* variable, const char* below) -> fs::path {
    const char* value = std::getenv(variable);
    if (!value || !*value || fs::path(value).is_relative()) return {};
    return fs::path(value) / below;
  };
  for (const auto& base : {dir("TORCHPATCH_CACHE_DIR", ""), dir("XDG_CACHE_HOME", "torchpatch"),
                           dir("HOME", ".cache/torchpatch")}) {
    if (!base.empty()) return base / "plugin-probes.json";
  }
  return {};
}

fs::path bundled_plugin_dir() {
  // Beside the library that holds this function (libtorchpatch_host.so in <prefix>/lib, or in the
  // build tree's lib/), whichever program loaded it: an installed package's own plugins.
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&bundled_plugin_dir), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const auto library = fs::canonical(info.dli_fname, ec);
    if (!ec) return library.parent_path() / "torchpatch" / "plugins";
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return exe.parent_path().parent_path() / "lib" / "torchpatch" / "plugins";
}

}  // namespace torchpatch
