// Output capture: named outputs (router logits, chosen experts, ...) collected from the patch points
// of a model during a forward, as Hugging Face's OutputRecorder / capture_outputs do.
#pragma once

#include "torchpatch/export.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/patching/module_class.h"

namespace torchpatch {

/// Which outputs a name collects: element `index` of the output tuple of every module built for patch
/// point `target` (a Hugging Face class name such as "Qwen2MoeTopKRouter"), optionally only those
/// whose module path contains `layer_name`. Matching is by patch point, so a recorder follows a
/// replacement (what Python's `patch_output_recorders` does by hand); a replacement's own class name
/// works too.
struct TORCHPATCH_API OutputRecorder {
  std::string target;
  int index = 0;
  std::string layer_name;
};

/// Output recorders by model class, then by output name. Families add theirs when registered; the
/// process-wide table is global_recorder_table(), and a Registries object owns a table of its own.
class TORCHPATCH_API RecorderTable {
 public:
  /// Adds (or replaces) recorder `name` for models of class `model_class` (e.g. "Qwen2MoeForCausalLM").
  /// Throws Error for an empty name or target or a negative index. Thread-safe.
  void add(const std::string& model_class, const std::string& name, const OutputRecorder& recorder);
  /// Removes recorder `name` of `model_class`; false when there was none.
  bool remove(const std::string& model_class, const std::string& name);
  /// The recorders of `model_class` by name.
  std::map<std::string, OutputRecorder> of(const std::string& model_class) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::map<std::string, OutputRecorder>> recorders_;
};

/// The process-wide recorder table (the built-in families' recorders are in it).
TORCHPATCH_API RecorderTable& global_recorder_table();

/// Python-named functions on the process-wide table.
TORCHPATCH_API void register_output_recorder(const std::string& model_class, const std::string& name,
                                             const OutputRecorder& recorder);
TORCHPATCH_API bool unregister_output_recorder(const std::string& model_class, const std::string& name);
TORCHPATCH_API std::map<std::string, OutputRecorder> output_recorders(const std::string& model_class);

/// Collects the named outputs of one forward on this thread while alive (scopes nest; the innermost
/// collects). Throws InputError naming the known recorders for a name `model_class` has none for.
class TORCHPATCH_API CaptureOutputs {
 public:
  CaptureOutputs(const std::string& model_class, const std::vector<std::string>& names,
                 const RecorderTable& recorders = global_recorder_table());
  ~CaptureOutputs();
  CaptureOutputs(const CaptureOutputs&) = delete;
  CaptureOutputs& operator=(const CaptureOutputs&) = delete;

  /// What was collected, per name, in call order (one entry per matching module call).
  std::map<std::string, std::vector<at::Tensor>> take();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

/// Called with a patch point's outputs by the module that called it (its output tuple in Hugging
/// Face's order). Cheap when nothing is being captured. A replacement that calls patch points of its
/// own reports their outputs the same way.
TORCHPATCH_API void report_outputs(const PatchableModule& module, const std::vector<at::Tensor>& outputs);

/// Whether a CaptureOutputs is open on this thread (so callers can skip work no one will record).
TORCHPATCH_API bool capturing_outputs();

}  // namespace torchpatch
