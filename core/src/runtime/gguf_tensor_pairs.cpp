#include "runtime/gguf_tensor_pairs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "torchpatch/error.h"
#include "torchpatch/printable.h"

namespace torchpatch::gguf_pairs {

using T = GgufTensorTransform;

std::vector<int64_t> joined_shape(GgufTensorTransform transform, const std::string& first_name,
                                  const std::vector<int64_t>& a, const std::string& second_name,
                                  const std::vector<int64_t>& b, const std::filesystem::path& file) {
  const auto refuse = [&](const char* expected) {
    return CheckpointError(fmt::format("{}: tensors '{}' [{}] and '{}' [{}] are not the two halves of one tensor "
                                       "({})",
                                       file.string(), printable(first_name), fmt::join(a, ", "),
                                       printable(second_name), fmt::join(b, ", "), expected));
  };
  switch (transform) {
    case T::kJoinMlaKvB:  // attn_k_b [H, kv_lora, nope], attn_v_b [H, v, kv_lora] -> [H (nope + v), kv_lora]
      if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[1] != b[2]) {
        throw refuse("kv_b_proj's key and value halves: [heads, kv_lora_rank, nope] and [heads, v, kv_lora_rank]");
      }
      return {a[0] * (a[2] + b[1]), a[1]};
    case T::kJoinInterleavedTransposed:  // gate, up [E, I, H] -> [E, H, 2I]
      if (a.size() != 3 || a != b) throw refuse("gate and up of stacked experts: [experts, rows, columns] alike");
      return {a[0], a[2], 2 * a[1]};
    case T::kJoinInterleaved:  // gate, up biases [E, I] -> [E, 2I]
      if (a.size() != 2 || a != b) throw refuse("gate and up biases of stacked experts: [experts, rows] alike");
      return {a[0], 2 * a[1]};
    default: throw refuse("not a joined pair");
  }
}

at::Tensor join(GgufTensorTransform transform, const at::Tensor& a, const at::Tensor& b) {
  switch (transform) {
    case T::kJoinMlaKvB: return at::cat({a.transpose(1, 2), b}, 1).reshape({a.size(0) * (a.size(2) + b.size(1)), a.size(1)});
    case T::kJoinInterleavedTransposed:
      return at::stack({a, b}, 2).reshape({a.size(0), 2 * a.size(1), a.size(2)}).transpose(1, 2).contiguous();
    case T::kJoinInterleaved: return at::stack({a, b}, 2).reshape({a.size(0), 2 * a.size(1)});
    default: return a;
  }
}

std::pair<at::Tensor, at::Tensor> split(GgufTensorTransform transform, const std::string& name, const at::Tensor& hub,
                                        const nlohmann::json& config) {
  const auto refuse = [&](const std::string& expected) {
    return ConfigError(fmt::format("{}: a {} tensor [{}] is not {} (such a tensor is written to GGUF files from float "
                                   "weights: load with --dequantize, or without --quantize)",
                                   name, c10::toString(hub.scalar_type()), fmt::join(hub.sizes(), ", "), expected));
  };
  if (!at::isFloatingType(hub.scalar_type())) throw refuse("float");
  const auto t = hub.to(at::kFloat).cpu();
  switch (transform) {
    case T::kJoinMlaKvB: {
      const auto heads = config.value("num_attention_heads", int64_t{0});
      const auto nope = config.value("qk_nope_head_dim", int64_t{0});
      if (t.dim() != 2 || heads <= 0 || nope <= 0 || t.size(0) % heads != 0 || t.size(0) / heads <= nope) {
        throw refuse(fmt::format("rows of {} heads of {} key rows and value rows", heads, nope));
      }
      const auto per_head = t.reshape({heads, t.size(0) / heads, t.size(1)});
      return {per_head.narrow(1, 0, nope).transpose(1, 2).contiguous(),
              per_head.narrow(1, nope, per_head.size(1) - nope).contiguous()};
    }
    case T::kJoinInterleavedTransposed: {
      if (t.dim() != 3 || t.size(2) % 2 != 0) throw refuse("[experts, hidden, 2 x intermediate]");
      const auto rows = t.transpose(1, 2);  // [E, 2I, H], gate and up rows alternating
      return {rows.slice(1, 0, rows.size(1), 2).contiguous(), rows.slice(1, 1, rows.size(1), 2).contiguous()};
    }
    case T::kJoinInterleaved:
      if (t.dim() != 2 || t.size(1) % 2 != 0) throw refuse("[experts, 2 x intermediate]");
      return {t.slice(1, 0, t.size(1), 2).contiguous(), t.slice(1, 1, t.size(1), 2).contiguous()};
    default: throw refuse("a joined pair");
  }
}

}  // namespace torchpatch::gguf_pairs
