#include "torchpatch/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "checkpoint/directory_update.h"

namespace torchpatch::checkpoint {

namespace fs = std::filesystem;

namespace {

// A directory without safetensors weights: what it holds instead, and what to do about it.
std::string no_weights_message(const fs::path& dir) {
  std::string found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    const auto ext = it->path().extension().string();
    if (ext == ".bin" || ext == ".pt" || ext == ".pth") {
      found = fmt::format("; it holds {}, PyTorch's pickle format, which torchpatch does not read (loading it "
                          "runs code from the file): convert it once with transformers, "
                          "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)",
                          name);
      break;
    }
    if (ext == ".gguf") found = fmt::format("; it holds {}, llama.cpp's format: give that file itself as the model", name);
  }
  return fmt::format("{}: no model.safetensors or model.safetensors.index.json{}", dir.string(), found);
}

}  // namespace

DirectoryHandle DirectoryHandle::open(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(fmt::format("{}: cannot open the checkpoint directory: {}", dir.string(), std::strerror(errno)));
  }
  DirectoryHandle handle;
  handle.path_ = dir;
  handle.fd_ = std::shared_ptr<const int>(new int(fd), [](const int* p) {
    unlock_directory(*p);
    ::close(*p);
    delete p;
  });
  // Shared while held: a save switches its files in under the exclusive lock. A commit seen under the
  // shared lock was left by a save that was killed; completing it needs the exclusive one.
  lock_directory(dir, fd, /*exclusive=*/false, "to read the checkpoint");
  while (has_interrupted_commit(dir)) {
    unlock_directory(fd);
    lock_directory(dir, fd, /*exclusive=*/true, "to complete an interrupted save");
    finish_interrupted_saves(dir, fd);
    lock_directory(dir, fd, /*exclusive=*/false, "to read the checkpoint");
  }
  remove_abandoned_staging(dir);
  return handle;
}

fs::path DirectoryHandle::file(const std::string& name) const {
  return fs::path(fmt::format("/proc/self/fd/{}", *fd_)) / name;
}

Checkpoint Checkpoint::open(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    Checkpoint ckpt;
    ckpt.path_ = path;
    ckpt.files_.push_back(SafetensorsFile::open(path));
    for (const auto& info : ckpt.files_.front()->tensors()) ckpt.where_.emplace(info.name, ckpt.files_.front().get());
    for (const auto& [name, file] : ckpt.where_) ckpt.keys_.push_back(name);
    std::sort(ckpt.keys_.begin(), ckpt.keys_.end(), natural_key_less);
    return ckpt;
  }
  if (!fs::is_directory(path, ec)) {
    throw CheckpointError(no_weights_message(path));
  }
  return open(DirectoryHandle::open(path));
}

Checkpoint Checkpoint::open(const DirectoryHandle& dir) {
  Checkpoint ckpt;
  const fs::path& path = dir.path();
  ckpt.path_ = path;
  const fs::path index = path / "model.safetensors.index.json";
  auto add = [&](const std::shared_ptr<const TensorSource>& file) {
    for (const auto& info : file->tensors()) {
      auto [it, fresh] = ckpt.where_.emplace(info.name, file.get());
      if (!fresh) {
        throw CheckpointError(fmt::format("{}: tensor '{}' is also in {}", file->path().string(), info.name,
                                          it->second->path().string()));
      }
    }
    ckpt.files_.push_back(file);
  };
  if (path_exists(dir.file("model.safetensors.index.json"))) {
    const auto j = read_json_file(dir.file("model.safetensors.index.json"),
                                  [](const std::string& message) { throw CheckpointError(message); }, {}, index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw CheckpointError(fmt::format("{}: no 'weight_map' object", index.string()));
    }
    std::map<std::string, std::vector<std::string>> shards;  // shard file -> tensors the index puts there
    for (const auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) throw CheckpointError(fmt::format("{}: weight_map['{}'] is not a file name", index.string(), name));
      shards[shard.get<std::string>()].push_back(name);
    }
    for (const auto& [shard, names] : shards) {
      const fs::path file = path / shard;
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == ".." ||
          !path_exists(dir.file(shard))) {
        throw CheckpointError(fmt::format("{}: names shard '{}' (for tensor '{}'), which does not exist",
                                          index.string(), shard, names.front()));
      }
      auto opened = SafetensorsFile::open(dir.file(shard), file);
      for (const auto& name : names) {
        if (!opened->find(name)) {
          throw CheckpointError(fmt::format("{}: says tensor '{}' is in {}, which has no such tensor", index.string(),
                                            name, file.string()));
        }
      }
      add(opened);
    }
  } else if (path_exists(dir.file("model.safetensors"))) {
    add(SafetensorsFile::open(dir.file("model.safetensors"), path / "model.safetensors"));
  } else {
    throw CheckpointError(no_weights_message(path));
  }
  for (const auto& [name, file] : ckpt.where_) ckpt.keys_.push_back(name);
  std::sort(ckpt.keys_.begin(), ckpt.keys_.end(), natural_key_less);
  return ckpt;
}

Checkpoint Checkpoint::of(std::shared_ptr<const TensorSource> source, const fs::path& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  for (const auto& info : source->tensors()) ckpt.where_.emplace(info.name, source.get());
  for (const auto& [name, file] : ckpt.where_) ckpt.keys_.push_back(name);
  std::sort(ckpt.keys_.begin(), ckpt.keys_.end(), natural_key_less);
  ckpt.files_.push_back(std::move(source));
  return ckpt;
}

const TensorSource& Checkpoint::file_of(const std::string& key) const {
  auto it = where_.find(key);
  if (it == where_.end()) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path_.string(), key));
  return *it->second;
}

const TensorInfo& Checkpoint::info(const std::string& key) const { return *file_of(key).find(key); }

at::Tensor Checkpoint::tensor(const std::string& key) const { return file_of(key).tensor(key); }

bool Checkpoint::maps(const void* p) const {
  return std::any_of(files_.begin(), files_.end(), [p](const auto& file) { return file->maps(p); });
}

}  // namespace torchpatch::checkpoint
