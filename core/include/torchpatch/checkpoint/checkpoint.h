// A checkpoint's tensors: one model.safetensors, or shards listed in model.safetensors.index.json.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/export.h"

namespace torchpatch::checkpoint {

/// A checkpoint directory held open for reading: while any copy of the handle lives it holds a
/// shared lock (flock) on the directory, and a save switches its files in under the exclusive one, so
/// config and weights read through one handle belong to one checkpoint. Open it, read what is needed
/// (weights are memory-mapped, and stay valid after the switch), and let it go (the lock goes with
/// the last copy): a save to the same directory waits for it. Opening completes a save that was killed while switching its files in.
class TORCHPATCH_API DirectoryHandle {
 public:
  /// Throws CheckpointError naming `dir` when it is not a directory that can be opened, or when an
  /// interrupted save there cannot be completed (no write access).
  static DirectoryHandle open(const std::filesystem::path& dir);
  /// The directory as given, for messages.
  const std::filesystem::path& path() const { return path_; }
  /// Where to open `name` inside the held directory.
  std::filesystem::path file(const std::string& name) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<const int> fd_;
};

class TORCHPATCH_API Checkpoint {
 public:
  /// Opens `dir/model.safetensors.index.json` and its shards when present, else `dir/model.safetensors`
  /// (or a .safetensors file given directly). Throws CheckpointError naming the file: no weights, an
  /// index that is not JSON or lacks weight_map, an index naming a missing shard or a tensor its shard
  /// does not hold, the same tensor in two shards.
  static Checkpoint open(const std::filesystem::path& path);
  /// The same, reading every file through `dir`.
  static Checkpoint open(const DirectoryHandle& dir);
  /// The tensors of `source` (a GGUF model's, say), opened from `path`.
  static Checkpoint of(std::shared_ptr<const TensorSource> source, const std::filesystem::path& path);

  /// Every tensor name, in natural order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool contains(const std::string& key) const { return where_.count(key) > 0; }
  const TensorSource& file_of(const std::string& key) const;
  const TensorInfo& info(const std::string& key) const;
  /// The tensor, viewing the memory map where it can (see SafetensorsFile::tensor).
  at::Tensor tensor(const std::string& key) const;
  const std::vector<std::shared_ptr<const TensorSource>>& files() const { return files_; }
  /// Whether `p` points into one of its files' mappings.
  bool maps(const void* p) const;
  /// The directory or file it was opened from.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::vector<std::shared_ptr<const TensorSource>> files_;
  std::map<std::string, const TensorSource*> where_;
  std::vector<std::string> keys_;
};

}  // namespace torchpatch::checkpoint
