// MoE routing record and replay: which experts every sparse layer chose, kept so a later pass (a
// training step in RLHF) can be forced to route exactly the same way.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/models/pretrained.h"

namespace torchpatch {

/// A router that can be told which experts to use. While routes are forced it returns them as its
/// indices and recomputes their weights from its live logits, so gradients still reach the router.
class TORCHPATCH_API ReplayableRouter {
 public:
  virtual ~ReplayableRouter();
  /// Forces `indices` [T, K] (int64) for the next forwards; undefined clears.
  virtual void force_routes(const at::Tensor& indices) = 0;
};

/// The sparse layers' routers of `model`, in layer order.
TORCHPATCH_API std::vector<std::shared_ptr<PatchableModule>> moe_routers(const PretrainedModel& model);

/// RAII: forces recorded routes on every router of `model` and clears them when it ends, exceptions
/// included. Checks first that the model has exactly one route tensor per router, that each router
/// can replay, and that each tensor is [T, top_k] of valid expert ids; throws InputError naming the
/// layer and the fault otherwise (nothing is forced then). A forward whose token count differs from
/// the routes' T is an error too.
class TORCHPATCH_API ReplayMoeRouting {
 public:
  ReplayMoeRouting(const PretrainedModel& model, const std::vector<at::Tensor>& per_layer_indices);
  ~ReplayMoeRouting();
  ReplayMoeRouting(const ReplayMoeRouting&) = delete;
  ReplayMoeRouting& operator=(const ReplayMoeRouting&) = delete;

 private:
  std::vector<ReplayableRouter*> routers_;
  std::vector<std::shared_ptr<PatchableModule>> keep_alive_;
};

/// Per layer [T, K] -> vLLM's `routed_experts` array [T, layers, K] int32.
TORCHPATCH_API at::Tensor routes_to_array(const std::vector<at::Tensor>& per_layer_indices);
/// vLLM's [T, layers, K] array -> per layer [T, K] int64. InputError for another rank.
TORCHPATCH_API std::vector<at::Tensor> routes_from_array(const at::Tensor& routed_experts);

/// Writes a C-ordered numpy .npy file (format 1.0) of an int32, int64, float32 or float64 tensor, whole
/// or not at all (checkpoint::AtomicFile: checked, synced, renamed over `path`); a failed write, a full
/// disk say, is a CheckpointError naming the file.
TORCHPATCH_API void save_npy(const std::filesystem::path& path, const at::Tensor& tensor);
/// Reads what save_npy writes (and numpy's own little-endian C-ordered files of those dtypes);
/// InputError naming the file for anything else.
TORCHPATCH_API at::Tensor load_npy(const std::filesystem::path& path);

}  // namespace torchpatch
