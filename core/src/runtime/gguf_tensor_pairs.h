// Internal: hub tensors that llama.cpp's converters write as two GGUF tensors, or reshaped
// (GgufTensorTransform's kJoin* and kTransposeStacked): joined as they load, split as they save.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "torchpatch/models/gguf_architecture.h"

namespace torchpatch::gguf_pairs {

/// The hub tensor's shape from its two GGUF tensors' (LibTorch's order); a CheckpointError naming
/// both and `file` where they are not two halves of one.
std::vector<int64_t> joined_shape(GgufTensorTransform transform, const std::string& first_name,
                                  const std::vector<int64_t>& first, const std::string& second_name,
                                  const std::vector<int64_t>& second, const std::filesystem::path& file);

/// The hub tensor from the two GGUF tensors (float), whose shapes joined_shape accepted.
at::Tensor join(GgufTensorTransform transform, const at::Tensor& first, const at::Tensor& second);

/// The inverse of join for hub tensor `name` (float32 out); `config` gives what the shape does not
/// (kJoinMlaKvB: num_attention_heads, qk_nope_head_dim). ConfigError for a tensor that cannot be
/// split so (blocks, the wrong shape), naming it.
std::pair<at::Tensor, at::Tensor> split(GgufTensorTransform transform, const std::string& name, const at::Tensor& hub,
                                        const nlohmann::json& config);

}  // namespace torchpatch::gguf_pairs
