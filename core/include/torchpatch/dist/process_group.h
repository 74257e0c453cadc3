// A group of cooperating processes for tensor and expert parallelism: LibTorch's own c10d, with a
// TCPStore for the rendezvous and ProcessGroupGloo (TCP) for the collectives.
//
//   rank 0 serves the store on master_addr:master_port (unless a launcher's agent already does),
//   every rank connects to it, and Gloo connects every pair of ranks; each collective then waits at
//   most `timeout`, so a rank that died or stopped answering is an error, never a hang.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/error.h"
#include "torchpatch/export.h"

namespace torchpatch::dist {

/// Joining or running a process group failed: a port in use, a peer that never came, a rank that
/// died or timed out, a bad launcher variable. The message names the rank, the peer or the variable.
class TORCHPATCH_API DistError : public Error {
 public:
  using Error::Error;
};

/// Where this process stands in its group and how it reaches the others.
struct GroupOptions {
  int rank = 0;                             ///< this process: 0 .. world_size - 1
  int world_size = 1;                       ///< processes in the group
  std::string master_addr = "127.0.0.1";    ///< host whose store every rank connects to
  int master_port = 29500;                  ///< the store's TCP port
  std::chrono::milliseconds timeout{60000};  ///< bound on joining and on every collective
  /// A launcher (torchrun's agent) already serves the store on master_port: rank 0 connects to it
  /// as a client instead of listening.
  bool agent_store = false;
  std::string store_prefix;  ///< keys live under this prefix (torchrun: "/worker/attempt_<restart>")
};

/// The options a launcher such as torchrun sets: RANK, WORLD_SIZE, MASTER_ADDR (default
/// 127.0.0.1), MASTER_PORT (default 29500), TORCHELASTIC_USE_AGENT_STORE and
/// TORCHELASTIC_RESTART_COUNT. nullopt when neither RANK nor WORLD_SIZE is set; a missing partner,
/// a value that is not a number or a rank outside the world: DistError naming the variable.
TORCHPATCH_API std::optional<GroupOptions> options_from_environment();

/// A joined group. Collectives work on contiguous CPU tensors in place and throw DistError (naming
/// this rank, the operation and the cause) when a peer fails or `timeout` passes.
class TORCHPATCH_API ProcessGroup {
 public:
  /// Joins the group `options` describes; blocks until every rank has joined or `timeout` passed.
  static std::shared_ptr<ProcessGroup> join(const GroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const GroupOptions& options() const;

  /// tensor = the sum of every rank's tensor.
  void all_reduce_sum(at::Tensor& tensor);
  /// tensor = rank `root`'s tensor.
  void broadcast(at::Tensor& tensor, int root);
  /// Every rank's tensor (same shape and dtype on all ranks), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  /// Returns when every rank has reached it.
  void barrier();

 private:
  struct State;
  explicit ProcessGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// The group models are being built for, or null: tensor-parallel replacements read it when they are
/// built (and keep it). Set for a scope by ActiveGroup.
TORCHPATCH_API std::shared_ptr<ProcessGroup> active_group();

/// Makes `group` the active one until the end of the scope (then the previous one again).
class TORCHPATCH_API ActiveGroup {
 public:
  explicit ActiveGroup(std::shared_ptr<ProcessGroup> group);
  ~ActiveGroup();
  ActiveGroup(const ActiveGroup&) = delete;
  ActiveGroup& operator=(const ActiveGroup&) = delete;

 private:
  std::shared_ptr<ProcessGroup> previous_;
};

}  // namespace torchpatch::dist
