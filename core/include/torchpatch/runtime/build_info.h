// What this build of torchpatch is and what it uses on this machine: `torchpatch --version`, and a
// host's own report.
#pragma once

#include <string>

#include "torchpatch/export.h"

namespace torchpatch {

/// Lines of text: torchpatch's version, the LibTorch it was built against and its intra-op threads,
/// the CPU's vector extensions that torchpatch's kernels use, and the quantized kernels' layout.
TORCHPATCH_API std::string build_info();

}  // namespace torchpatch
