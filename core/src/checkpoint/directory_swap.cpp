#include "checkpoint/directory_swap.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include <fmt/format.h>

#include "torchpatch/error.h"
#include "torchpatch/checkpoint/atomic_file.h"

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

namespace {

const char* kStagingMark = ".saving-";

// ".NAME.saving-PID-RANDOM" beside the target.
fs::path staging_path(const fs::path& target) {
  std::random_device seed;
  return target.parent_path() /
         fmt::format(".{}{}{}-{:08x}", target.filename().string(), kStagingMark, ::getpid(), seed());
}

// Staging directories of earlier saves of `target` whose process is gone (killed mid-save): the
// checkpoint under the name is complete, these are leftovers.
void remove_abandoned_staging(const fs::path& target) {
  const std::string prefix = "." + target.filename().string() + kStagingMark;
  std::error_code ec;
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;  // still saving
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

// The old directory's other files, hard-linked (copied across file systems) into `to`, subdirectories
// recreated, symlinks reproduced.
void carry_over(const fs::path& from, const fs::path& to, const DirectorySwap& swap, bool top) {
  for (const auto& entry : fs::directory_iterator(from)) {
    const std::string name = entry.path().filename().string();
    if (top && (swap.replaced(name) || name.find(".tmp.") != std::string::npos)) continue;
    const fs::path dest = to / name;
    const auto status = entry.symlink_status();
    if (fs::is_symlink(status)) {
      fs::create_symlink(fs::read_symlink(entry.path()), dest);
    } else if (fs::is_directory(status)) {
      fs::create_directory(dest);
      carry_over(entry.path(), dest, swap, false);
    } else {
      std::error_code ec;
      fs::create_hard_link(entry.path(), dest, ec);
      if (ec) fs::copy_file(entry.path(), dest);
    }
  }
}

// Swaps the two directory entries atomically; where the file system cannot, moves the old one aside
// first (a kill between the two renames then leaves the old checkpoint in the staging name).
void exchange(const fs::path& staging, const fs::path& target) {
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return;
  if (errno != EINVAL && errno != ENOSYS) {
    throw CheckpointError(fmt::format("{}: cannot switch the new checkpoint in: {}", target.string(), errno_text(errno)));
  }
  const fs::path aside = staging.string() + ".old";
  if (::rename(target.c_str(), aside.c_str()) != 0) {
    throw CheckpointError(fmt::format("{}: cannot switch the new checkpoint in: {}", target.string(), errno_text(errno)));
  }
  if (::rename(staging.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::rename(aside.c_str(), target.c_str());  // put the old one back
    throw CheckpointError(fmt::format("{}: cannot switch the new checkpoint in: {}", target.string(), errno_text(err)));
  }
  fs::rename(aside, staging);  // the old checkpoint, removed by the caller
}

}  // namespace

void replace_directory(const fs::path& given, const DirectorySwap& swap) {
  std::error_code ec;
  // Replace what a symlink points at, not the link.
  fs::path target = fs::weakly_canonical(fs::absolute(given), ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot resolve the path: {}", given.string(), ec.message()));
  if (target.filename().empty()) target = target.parent_path();
  const bool exists = fs::exists(target, ec);
  if (exists && !fs::is_directory(target, ec)) {
    throw CheckpointError(fmt::format("{}: exists and is not a directory", target.string()));
  }
  const fs::path parent = target.parent_path();
  try {
    fs::create_directories(parent);
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(fmt::format("{}: cannot create the parent directory: {}", target.string(), e.code().message()));
  }
  remove_abandoned_staging(target);
  const fs::path staging = staging_path(target);
  try {
    if (!fs::create_directory(staging, ec) && ec) {
      throw CheckpointError(fmt::format("{}: cannot create a staging directory in {}: {}", target.string(),
                                        parent.string(), ec.message()));
    }
    swap.write(staging);
    if (exists) {
      carry_over(target, staging, swap, /*top=*/true);
      fs::permissions(staging, fs::status(target).permissions());
    }
    sync_directory(staging);
    if (exists) {
      exchange(staging, target);
    } else if (::rename(staging.c_str(), target.c_str()) != 0) {
      throw CheckpointError(fmt::format("{}: cannot move the new checkpoint in: {}", target.string(), errno_text(errno)));
    }
    sync_directory(parent);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(staging, ec);
    throw CheckpointError(fmt::format("{}: cannot save: {}: {}", target.string(), e.path1().string(), e.code().message()));
  } catch (...) {
    fs::remove_all(staging, ec);  // before the switch: the old checkpoint is untouched
    throw;
  }
  fs::remove_all(staging, ec);  // after the switch it holds the old checkpoint
}

}  // namespace torchpatch::checkpoint
