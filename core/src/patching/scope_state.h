// Internal: what an open ApplyPatches scope holds.
#pragma once

#include <mutex>
#include <vector>

#include "torchpatch/patching/scope.h"

namespace torchpatch {

struct ApplyPatches::State {
  PatchMapping mapping;
  PatchTables tables;
  std::mutex mutex;        // guards hits
  std::vector<int> hits;   // per mapping entry: patch points it matched
};

}  // namespace torchpatch
