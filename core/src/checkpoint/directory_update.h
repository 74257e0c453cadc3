// Internal: replacing a checkpoint's files inside its directory, which is never replaced itself: its
// owner, group, mode, other files and subdirectories stay as they were, a mount point works, and the
// parent need not be writable.
//
// A save writes the new files into a private staging directory inside the checkpoint directory
// (`.torchpatch-save-PID-RANDOM`, fsynced), then, holding an exclusive flock on the checkpoint
// directory, commits by renaming staging to `.torchpatch-commit-PID-RANDOM` (it holds a manifest:
// the files to move, in order, and the old checkpoint's files to remove), moves each file over its
// old namesake (weights first, the index and config.json last), removes the old checkpoint's files the
// new one lacks, and removes the commit directory. Readers (DirectoryHandle) hold a shared flock while
// they open config and weights, so they read the old checkpoint or the new one, never a mix.
//
// A kill before the commit leaves the old checkpoint and a staging directory, which the next save or
// load there removes (remove_abandoned_staging); a kill after it leaves a commit directory (no live
// save holds the lock then), which the next save or load there completes before reading
// (finish_interrupted_saves).
#pragma once

#include <filesystem>
#include <functional>
#include <set>
#include <string>

namespace torchpatch::checkpoint {

struct DirectoryUpdate {
  /// Writes the new checkpoint's files into `staging` (an empty directory inside the target).
  std::function<void(const std::filesystem::path& staging)> write;
  /// The old checkpoint's files in `dir` (config, weights, index, shards): those the new one does not
  /// have are removed. Called under the lock, on the directory as it is then.
  std::function<std::set<std::string>(const std::filesystem::path& dir)> old_files;
  /// Names moved in last, in this order (the index, then config.json), after every other file.
  std::vector<std::string> last;
};

/// Puts the new checkpoint's files in place in `target` (created when absent; a symlink is followed).
/// On any error before the commit the old checkpoint is untouched and the staging directory removed;
/// throws CheckpointError naming the path and the cause.
void update_directory(const std::filesystem::path& target, const DirectoryUpdate& update);

/// With the exclusive lock held on `dir_fd` (the directory `dir`): completes a save that was killed
/// after its commit. Throws CheckpointError when it cannot be completed (no write access).
void finish_interrupted_saves(const std::filesystem::path& dir, int dir_fd);

/// Removes the staging directories of saves killed before their commit (best effort: a leftover
/// that cannot be removed is harmless, hidden and never read).
void remove_abandoned_staging(const std::filesystem::path& dir);

/// Whether `dir` holds a committed save that was not completed (its saver is gone when the caller
/// holds the shared lock).
bool has_interrupted_commit(const std::filesystem::path& dir);

/// flock on a directory descriptor, waiting at most `seconds`; throws CheckpointError naming `dir` and
/// `why` when it cannot be had (a save that does not finish, or a reader that does not let go).
void lock_directory(const std::filesystem::path& dir, int dir_fd, bool exclusive, const char* why, double seconds = 120);
void unlock_directory(int dir_fd);

/// fsync of a directory (so entries created or renamed in it are durable); throws CheckpointError.
void sync_directory(const std::filesystem::path& dir);

}  // namespace torchpatch::checkpoint
