// Shared test helpers: reference data paths and tensor comparison that prints the max difference.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>

#include <sys/resource.h>

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

/// Seconds `run` takes: the least of `runs` runs, the one least disturbed by whatever else the machine
/// is doing. Tests compare such figures with each other (growth as a ratio), never with a wall-clock bound.
template <class Run>
double least_seconds(Run&& run, int runs = 3) {
  double least = 1e300;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    least = std::min(least, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return least;
}

/// How the time of work on n items grows from n/10 to n: about 10 when linear, 100 when quadratic.
/// Prints both figures and the ratio.
template <class RunOnItems>
double growth_over_tenfold(const std::string& what, int64_t n, RunOnItems&& run_on) {
  const double small = least_seconds([&] { run_on(n / 10); });
  const double large = least_seconds([&] { run_on(n); });
  const double ratio = large / std::max(small, 1e-6);
  std::cout << what << ": " << n / 10 << " in " << small << " s, " << n << " in " << large << " s, ratio " << ratio
            << " (linear about 10, quadratic about 100)\n";
  return ratio;
}

/// The bound growth_over_tenfold's ratio is held to: four times linear, well under quadratic (room for
/// n log n, caches outgrown and a sanitizer build).
constexpr double kLinearGrowthBound = 40.0;

/// The process's peak resident memory in MB so far (it only grows): a test that must refuse before
/// allocating compares it before and after, which a busy machine cannot disturb as it can a clock.
inline double peak_resident_mb() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

}  // namespace testutil
