#include "torchpatch/checkpoint/checkpoint.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"

namespace torchpatch::checkpoint {

namespace fs = std::filesystem;

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  const fs::path index = path / "model.safetensors.index.json";
  auto add = [&](const std::shared_ptr<SafetensorsFile>& file) {
    for (const auto& info : file->tensors()) {
      auto [it, fresh] = ckpt.where_.emplace(info.name, file.get());
      if (!fresh) {
        throw CheckpointError(fmt::format("{}: tensor '{}' is also in {}", file->path().string(), info.name,
                                          it->second->path().string()));
      }
    }
    ckpt.files_.push_back(file);
  };
  if (fs::is_regular_file(path)) {
    add(SafetensorsFile::open(path));
  } else if (fs::is_regular_file(index)) {
    nlohmann::json j;
    try {
      std::ifstream in(index);
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("{}: not valid JSON: {}", index.string(), e.what()));
    }
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
      if (shard.find('/') != std::string::npos || !fs::is_regular_file(file)) {
        throw CheckpointError(fmt::format("{}: names shard '{}' (for tensor '{}'), which does not exist",
                                          index.string(), shard, names.front()));
      }
      auto opened = SafetensorsFile::open(file);
      for (const auto& name : names) {
        if (!opened->find(name)) {
          throw CheckpointError(fmt::format("{}: says tensor '{}' is in {}, which has no such tensor", index.string(),
                                            name, file.string()));
        }
      }
      add(opened);
    }
  } else if (fs::is_regular_file(path / "model.safetensors")) {
    add(SafetensorsFile::open(path / "model.safetensors"));
  } else {
    throw CheckpointError(fmt::format("{}: no model.safetensors or model.safetensors.index.json", path.string()));
  }
  for (const auto& [name, file] : ckpt.where_) ckpt.keys_.push_back(name);
  std::sort(ckpt.keys_.begin(), ckpt.keys_.end(), natural_key_less);
  return ckpt;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& key) const {
  auto it = where_.find(key);
  if (it == where_.end()) throw CheckpointError(fmt::format("{}: no tensor named '{}'", path_.string(), key));
  return *it->second;
}

const TensorInfo& Checkpoint::info(const std::string& key) const { return *file_of(key).find(key); }

at::Tensor Checkpoint::tensor(const std::string& key) const { return file_of(key).tensor(key); }

}  // namespace torchpatch::checkpoint
