// Internal: loading a plugin first in a short-lived child process, so that one that crashes, aborts
// or exits in its static initialisers or register function is refused instead of taking the host
// down; and a cache of the outcomes by file identity, so each file is probed once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

struct stat;

namespace torchpatch::probe {

/// How far loading got; the child reports each phase before entering it.
enum class Phase : char {
  kStaticInit = 'S',    ///< loading the library runs its static initialisers
  kDescriptor = 'D',    ///< calling the descriptor entry point
  kRegistration = 'R',  ///< calling the register function
  kDone = 'K',          ///< loading returned (accepted or refused, the parent's own load decides)
};

/// In a probe child (`fd` >= 0), tells the parent which phase starts now.
void mark(int fd, Phase phase);

struct Outcome {
  bool passed = false;
  std::string reason;  ///< why it failed: the signal or exit status and the phase
};

/// Forks; the child runs `load(fd)` (which marks its phases on `fd`) with stdout discarded and
/// stderr captured, then ends. A child that dies, exits on its own or outlives `timeout` fails.
Outcome run_in_child(const std::function<void(int fd)>& load, std::chrono::milliseconds timeout);

/// Outcomes by file identity (device, inode, size, modification and change times) and host build,
/// kept in a small JSON file. A missing or unreadable cache is empty; one that cannot be written is
/// left as it was (probing again next time is the only cost).
class Cache {
 public:
  explicit Cache(std::filesystem::path file) : file_(std::move(file)) {}
  static std::string key(const struct ::stat& st);
  std::optional<Outcome> find(const std::string& key);
  void store(const std::string& key, const std::filesystem::path& plugin, const Outcome& outcome);

 private:
  void read();
  std::filesystem::path file_;
  bool read_ = false;
  nlohmann::json entries_ = nlohmann::json::object();
};

}  // namespace torchpatch::probe
