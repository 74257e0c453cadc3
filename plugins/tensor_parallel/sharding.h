// The tensor-parallel plugin's load-time conversions: each rank keeps its slice of a tensor as it
// loads, and saving gathers the slices back (collectives: every rank saves, in the same order).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/dist/process_group.h"

namespace torchpatch_tensor_parallel {

/// A run of a dimension split into `parts` equal parts: a rank keeps part rank / (world / parts), so
/// with fewer parts than ranks (key/value heads) consecutive ranks hold the same part.
struct Segment {
  int64_t size = 0;   ///< entries in the whole tensor; 0: the whole dimension (one segment)
  int64_t parts = 0;  ///< the world size, or a divisor of it
};

/// Keeps this rank's part of each segment along `dim` (fused projections: one segment per projection,
/// e.g. q, k and v of qkv_proj) and concatenates them; its reverse gathers every rank's.
torchpatch::checkpoint::OpPtr shard(int64_t dim, std::vector<Segment> segments,
                                    std::shared_ptr<torchpatch::dist::ProcessGroup> group);

/// One segment: the whole dimension in `parts` parts.
inline torchpatch::checkpoint::OpPtr shard(int64_t dim, int64_t parts,
                                           std::shared_ptr<torchpatch::dist::ProcessGroup> group) {
  return shard(dim, {{0, parts}}, std::move(group));
}

/// A bias added after an all-reduce: rank 0 keeps it, the others hold zeros; saving takes rank 0's.
torchpatch::checkpoint::OpPtr on_rank_zero(std::shared_ptr<torchpatch::dist::ProcessGroup> group);

/// A converter from `key` to itself through `op`.
inline torchpatch::checkpoint::WeightConverter same_key(const std::string& key, torchpatch::checkpoint::OpPtr op) {
  return {{key}, {key}, {std::move(op)}};
}

}  // namespace torchpatch_tensor_parallel
