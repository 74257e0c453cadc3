// Internal: replacing a checkpoint directory as a whole. The new checkpoint is written into a
// staging directory beside the old one, the old directory's other files (tokenizer, README, ...) are
// hard-linked in, everything is synced, and one renameat2(RENAME_EXCHANGE) swaps the two directory
// entries. A kill at any moment leaves the old complete checkpoint or the new complete one under the
// name; a reader holding the directory open (DirectoryHandle) reads one or the other, never a mix.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace torchpatch::checkpoint {

struct DirectorySwap {
  /// Writes the new checkpoint's files into `staging` (an empty directory on the same file system).
  std::function<void(const std::filesystem::path& staging)> write;
  /// Whether a file of the old directory belongs to the old checkpoint's layout (config, weights,
  /// index, shards) and so is not carried over.
  std::function<bool(const std::string& name)> replaced;
};

/// Puts the new checkpoint in place at `target` (created when absent; a symlink is followed). On any
/// error before the switch the old checkpoint is untouched and the staging directory removed;
/// throws CheckpointError naming the path and the cause.
void replace_directory(const std::filesystem::path& target, const DirectorySwap& swap);

/// fsync of a directory (so entries created or renamed in it are durable); throws CheckpointError.
void sync_directory(const std::filesystem::path& dir);

}  // namespace torchpatch::checkpoint
