// How a long stage (loading, quantizing, saving) goes, on stderr: nothing for a stage that ends within
// a couple of seconds; then, on a terminal, a bar with bytes and rate rewritten in place, and
// elsewhere (a log) one line when the stage ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "torchpatch/checkpoint/load.h"

namespace torchpatch::cli {

class StageProgress {
 public:
  /// `stage` names it ("loading tests/data/llama_basic"); shown once it has run `after_seconds`
  /// (0: at once); never when `enabled` is false.
  StageProgress(std::string stage, bool enabled, double after_seconds);
  /// Ends the stage: the bar's last state or the log line, when it was shown.
  ~StageProgress();
  StageProgress(const StageProgress&) = delete;
  StageProgress& operator=(const StageProgress&) = delete;

  /// What the library calls as bytes are done.
  checkpoint::Progress callback();

 private:
  void update(int64_t done, int64_t total);
  std::string status(double seconds) const;

  std::string stage_;
  bool enabled_;
  double after_;
  bool terminal_;
  bool shown_ = false;
  int64_t done_ = 0, total_ = 0;
  std::chrono::steady_clock::time_point start_, drawn_;
};

}  // namespace torchpatch::cli
