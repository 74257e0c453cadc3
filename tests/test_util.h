// Shared test helpers: reference data paths and tensor comparison that prints the max difference.
#pragma once

#include <filesystem>
#include <iostream>
#include <string>

#include <ATen/ATen.h>

#include "torchpatch/checkpoint/safetensors.h"

namespace testutil {

inline std::filesystem::path data_dir() { return TORCHPATCH_TEST_DATA_DIR; }

/// max |a - b| over the positions where `mask` [B, T] is 1 (the last-but-one and last dims of a and b
/// are T and the feature dim; leading dims broadcast). Undefined mask: everywhere.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask = {}) {
  auto diff = (a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble)).abs();
  if (mask.defined()) diff = diff * mask.to(at::kCPU, at::kDouble).unsqueeze(-1);
  return diff.numel() == 0 ? 0.0 : diff.max().item<double>();
}

/// Compares and prints "name: max abs diff = X" as llm.c does, returning whether it is within tolerance
/// (|a-b| <= atol + rtol*|b| at every compared position).
inline bool close(const std::string& name, const at::Tensor& actual, const at::Tensor& expected,
                  const at::Tensor& mask = {}, double atol = 1e-4, double rtol = 1e-4) {
  if (actual.sizes() != expected.sizes()) {
    std::cout << name << ": shape " << actual.sizes() << " != " << expected.sizes() << "\n";
    return false;
  }
  auto a = actual.to(at::kCPU, at::kDouble), e = expected.to(at::kCPU, at::kDouble);  // either may be on a GPU
  auto excess = (a - e).abs() - (atol + rtol * e.abs());
  if (mask.defined()) excess = excess.masked_fill(mask.to(at::kCPU, at::kBool).unsqueeze(-1).logical_not(), -1.0);
  const double diff = max_abs_diff(actual, expected, mask);
  const bool ok = excess.max().item<double>() <= 0.0;
  std::cout << name << ": max abs diff = " << diff << (ok ? " (ok)" : " (TOO LARGE)") << "\n";
  return ok;
}

}  // namespace testutil
