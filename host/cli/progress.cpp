#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

namespace torchpatch::cli {

namespace {
std::string bytes_text(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.0f} kB", bytes / 1e3);
}
}  // namespace

StageProgress::StageProgress(std::string stage, bool enabled, double after_seconds)
    : stage_(std::move(stage)),
      enabled_(enabled),
      after_(after_seconds),
      // Under --tp rank 0's stderr is a pipe to the launcher, which says whether it ends on a terminal.
      terminal_(::isatty(STDERR_FILENO) == 1 || std::getenv("TORCHPATCH_STDERR_IS_TERMINAL") != nullptr),
      start_(std::chrono::steady_clock::now()) {}

checkpoint::Progress StageProgress::callback() {
  if (!enabled_) return {};
  return [this](int64_t done, int64_t total) { update(done, total); };
}

std::string StageProgress::status(double seconds) const {
  const double rate = seconds > 0 ? static_cast<double>(done_) / seconds : 0;
  return fmt::format("{}/{} in {:.1f} s ({}/s)", bytes_text(static_cast<double>(done_)),
                     bytes_text(static_cast<double>(total_)), seconds, bytes_text(rate));
}

void StageProgress::update(int64_t done, int64_t total) {
  done_ = done;
  total_ = total;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (!terminal_ || seconds < after_) return;  // a log gets its line when the stage ends
  if (shown_ && now - drawn_ < std::chrono::milliseconds(100) && done < total) return;
  shown_ = true;
  drawn_ = now;
  constexpr int kWidth = 30;
  const double fraction = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::cerr << fmt::format("\r{} [{}{}] {:3.0f}% {}", stage_, std::string(filled, '#'), std::string(kWidth - filled, ' '),
                           100 * fraction, status(seconds))
            << std::flush;
}

StageProgress::~StageProgress() {
  if (!enabled_) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (terminal_) {
    if (shown_) std::cerr << "\n";
    return;
  }
  if (seconds >= after_ && total_ > 0) std::cerr << fmt::format("{}: {}\n", stage_, status(seconds));
}

}  // namespace torchpatch::cli
