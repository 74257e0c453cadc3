// A GGUF file read as a Hugging Face checkpoint: the config.json its metadata describes (through the
// family that reads its `general.architecture`) and its tensors under Hugging Face's names, so it
// builds, patches, loads and saves like any checkpoint.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/models/family.h"

namespace torchpatch {

struct TORCHPATCH_API GgufModel {
  std::shared_ptr<const checkpoint::GgufFile> file;
  /// What config.json would hold (Family::gguf's config).
  nlohmann::json config;
  /// The tensors under Hugging Face's names, dequantized to float32 as they are read (and q/k rows
  /// put back in Hugging Face's order where llama.cpp permuted them). A tensor no naming rule knows
  /// keeps its GGUF name, so loading reports it as unexpected.
  std::shared_ptr<const checkpoint::TensorSource> tensors;
};

/// Reads `path` (a .gguf file). ConfigError naming the file when no family reads its architecture
/// (listing those that are read) or its metadata lacks what the family needs; CheckpointError for a
/// file that is not valid GGUF.
TORCHPATCH_API GgufModel read_gguf_model(const std::filesystem::path& path, const FamilyRegistry& families);

}  // namespace torchpatch
