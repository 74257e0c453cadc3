// Internal: single-pass float32 forms of ops a decoding step runs dozens of times. Each replaces a
// chain of five to fifteen LibTorch ops whose dispatch, not arithmetic, is the cost at one token.
#pragma once

#include <initializer_list>

#include <ATen/core/Tensor.h>

namespace torchpatch::nn {

/// Whether the fused forms serve these tensors: float32 on the CPU, no gradient wanted.
bool fused_ops_apply(std::initializer_list<const at::Tensor*> tensors);

/// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps), times `weight` (or `1 + weight`).
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool unit_offset);

/// Rotary embedding of x [B, H, Q, hd] with cos/sin [B, Q, rot] (rot <= hd, the rest passed through).
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace torchpatch::nn
