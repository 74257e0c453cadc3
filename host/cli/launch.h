// --tp N: this program started N times as the ranks of one process group on loopback.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "args.h"

namespace torchpatch::cli {

/// The --tp option of the commands that run as a group of processes (run, generate, bench).
OptionSpec tp_option();

/// With --tp N (N > 1) in `args`: starts this program N times as ranks 0..N-1 (RANK, WORLD_SIZE,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT: $MASTER_PORT or a free port), with the same command and
/// arguments minus --tp, waits for them and returns the command's exit code: 0 when every rank
/// succeeded, else the first failed rank's. When a rank fails, the message names it and the others
/// get a few seconds to stop on their own before they are stopped; an interrupt stops them all.
/// Without --tp, or with --tp 1 (removed from `args`): nullopt, the command runs in this process.
/// `before_start` sees the arguments (minus --tp) before any rank starts; what it throws ends the
/// launch, said once.
std::optional<int> launch_ranks(const std::string& command, std::vector<std::string>& args, bool debug,
                                const std::function<void(const std::vector<std::string>&)>& before_start = {});

}  // namespace torchpatch::cli
