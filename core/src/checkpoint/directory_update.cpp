#include "checkpoint/directory_update.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/atomic_file.h"
#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "torchpatch/printable.h"

namespace torchpatch::checkpoint {

namespace fs = std::filesystem;

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw CheckpointError(fmt::format("{}: cannot sync the directory: {}", dir.string(), errno_text(err)));
  }
  ::close(fd);
}

void lock_directory(const fs::path& dir, int dir_fd, bool exclusive, const char* why, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (::flock(dir_fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      throw CheckpointError(fmt::format("{}: cannot lock the directory {}: {}", dir.string(), why, errno_text(errno)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw CheckpointError(fmt::format("{}: still locked after {:.0f} s, so it cannot be locked {}: {} holds it (a "
                                        "process stopped or stuck mid-way, or this one holding the directory open)",
                                        dir.string(), seconds, why, exclusive ? "a reader or a save" : "a save"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void unlock_directory(int dir_fd) { ::flock(dir_fd, LOCK_UN); }

namespace {

constexpr char kStaging[] = ".torchpatch-save-";
constexpr char kCommit[] = ".torchpatch-commit-";
constexpr char kManifest[] = "manifest.json";

bool starts_with(const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; }

std::vector<std::string> entries_starting(const fs::path& dir, const char* prefix) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (starts_with(name, prefix)) names.push_back(name);
  }
  return names;
}

// Whether the process that named `name` (PREFIX PID-RANDOM) may still run.
bool saver_alive(const std::string& name, const char* prefix) {
  const long pid = std::strtol(name.c_str() + std::char_traits<char>::length(prefix), nullptr, 10);
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH);
}

// A file name the manifest may move or remove: one entry of the checkpoint directory itself.
std::string plain_name(const nlohmann::json& value, const fs::path& manifest) {
  const std::string name = value.is_string() ? value.get<std::string>() : std::string();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw CheckpointError(fmt::format("{}: {} is not a file name of the checkpoint directory", manifest.string(),
                                      printable(value.dump())));
  }
  return name;
}

// Moves the files the commit's manifest lists into `dir` (those still there: a kill may have come
// part-way), removes the old checkpoint's files it lists, then the commit directory.
void complete(const fs::path& dir, const std::string& commit_name) {
  const fs::path commit = dir / commit_name, manifest_path = commit / kManifest;
  const auto manifest = read_json_file(manifest_path, [](const std::string& m) { throw CheckpointError(m); });
  if (!manifest.is_object() || !manifest.value("move", nlohmann::json()).is_array() ||
      !manifest.value("remove", nlohmann::json()).is_array()) {
    throw CheckpointError(fmt::format("{}: not a save's manifest (\"move\" and \"remove\" lists)", manifest_path.string()));
  }
  for (const auto& value : manifest["move"]) {
    const std::string name = plain_name(value, manifest_path);
    const fs::path from = commit / name;
    if (!path_exists(from)) continue;
    if (::rename(from.c_str(), (dir / name).c_str()) != 0) {
      throw CheckpointError(fmt::format("{}: cannot move the new '{}' in: {}", dir.string(), name, errno_text(errno)));
    }
  }
  for (const auto& value : manifest["remove"]) {
    const std::string name = plain_name(value, manifest_path);
    if (::unlink((dir / name).c_str()) != 0 && errno != ENOENT) {
      throw CheckpointError(fmt::format("{}: cannot remove the old '{}': {}", dir.string(), name, errno_text(errno)));
    }
  }
  sync_directory(dir);
  std::error_code ec;
  fs::remove_all(commit, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot remove {}: {}", dir.string(), commit.string(), ec.message()));
  sync_directory(dir);
}

// The new file takes the place of its namesake: it keeps that file's mode, and its owner and group
// where this process may set them (root; else the owner stays the saver).
void keep_attributes(const fs::path& old_file, const fs::path& new_file) {
  struct stat st {};
  if (::lstat(old_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  if (::chown(new_file.c_str(), st.st_uid, st.st_gid) != 0) (void)::chown(new_file.c_str(), static_cast<uid_t>(-1), st.st_gid);
  ::chmod(new_file.c_str(), st.st_mode & 07777);
}

class DirectoryFd {
 public:
  explicit DirectoryFd(const fs::path& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) throw CheckpointError(fmt::format("{}: cannot open the directory: {}", dir.string(), errno_text(errno)));
  }
  ~DirectoryFd() { ::close(fd_); }
  DirectoryFd(const DirectoryFd&) = delete;
  DirectoryFd& operator=(const DirectoryFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

fs::path resolved_target(const fs::path& given) {
  std::error_code ec;
  fs::path target = fs::weakly_canonical(fs::absolute(given), ec);  // a symlink: what it points at
  if (ec) throw CheckpointError(fmt::format("{}: cannot resolve the path: {}", given.string(), ec.message()));
  if (target.filename().empty()) target = target.parent_path();
  if (fs::exists(target, ec) && !fs::is_directory(target, ec)) {
    throw CheckpointError(fmt::format("{}: exists and is not a directory", target.string()));
  }
  try {
    fs::create_directories(target);
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(fmt::format("{}: cannot create the directory: {}", target.string(), e.code().message()));
  }
  return target;
}

// The manifest: every new file (the `last` ones at the end, in their order) and the old files to remove.
nlohmann::json manifest_of(const fs::path& staging, const std::set<std::string>& old_files,
                           const std::vector<std::string>& last) {
  std::set<std::string> written;
  for (const auto& entry : fs::directory_iterator(staging)) written.insert(entry.path().filename().string());
  std::vector<std::string> moved;
  for (const auto& name : written) {
    if (std::find(last.begin(), last.end(), name) == last.end()) moved.push_back(name);
  }
  for (const auto& name : last) {
    if (written.count(name)) moved.push_back(name);
  }
  std::vector<std::string> removed;
  for (const auto& name : old_files) {
    if (!written.count(name)) removed.push_back(name);
  }
  return {{"move", moved}, {"remove", removed}};
}

}  // namespace

bool has_interrupted_commit(const fs::path& dir) { return !entries_starting(dir, kCommit).empty(); }

void finish_interrupted_saves(const fs::path& dir, int /*dir_fd: held exclusively by the caller*/) {
  for (const auto& name : entries_starting(dir, kCommit)) {
    try {
      complete(dir, name);
    } catch (const CheckpointError& e) {
      throw CheckpointError(fmt::format("{}: a save here was interrupted while it switched its files in ({}), and it "
                                        "cannot be completed now: {}. Loading or saving here with write access "
                                        "completes it.",
                                        dir.string(), name, e.what()));
    }
  }
}

void remove_abandoned_staging(const fs::path& dir) {
  for (const auto& name : entries_starting(dir, kStaging)) {
    if (saver_alive(name, kStaging)) continue;
    std::error_code ignored;  // the checkpoint is complete without it; a leftover that cannot go is harmless
    fs::remove_all(dir / name, ignored);
  }
}

void update_directory(const fs::path& given, const DirectoryUpdate& update) {
  const fs::path target = resolved_target(given);
  const DirectoryFd dir(target);
  std::random_device seed;
  const std::string suffix = fmt::format("{}-{:08x}", ::getpid(), seed());
  const fs::path staging = target / (kStaging + suffix), commit = target / (kCommit + suffix);
  if (::mkdir(staging.c_str(), 0700) != 0) {
    throw CheckpointError(fmt::format("{}: cannot create a staging directory in it: {}", target.string(), errno_text(errno)));
  }
  struct Unlock {
    int fd;
    bool held = false;
    ~Unlock() {
      if (held) unlock_directory(fd);
    }
  } unlock{dir.get()};
  try {
    update.write(staging);
    lock_directory(target, dir.get(), /*exclusive=*/true, "to switch the new checkpoint in");
    unlock.held = true;
    finish_interrupted_saves(target, dir.get());
    remove_abandoned_staging(target);
    const auto old_files = update.old_files(target);
    for (const auto& entry : fs::directory_iterator(staging)) {
      keep_attributes(target / entry.path().filename(), entry.path());
    }
    write_file_atomically(staging / kManifest, manifest_of(staging, old_files, update.last).dump() + "\n");
    sync_directory(staging);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw CheckpointError(fmt::format("{}: cannot save: {}: {}", target.string(), e.path1().string(), e.code().message()));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // before the commit: the old checkpoint is untouched
    throw;
  }
  if (::rename(staging.c_str(), commit.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw CheckpointError(fmt::format("{}: cannot commit the new checkpoint: {}", target.string(), errno_text(err)));
  }
  sync_directory(target);
  try {
    complete(target, commit.filename().string());
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}; the new checkpoint is committed and the next load or save of {} puts it in "
                                      "place",
                                      e.what(), target.string()));
  }
}

}  // namespace torchpatch::checkpoint
