#include "torchpatch/patching/outputs.h"

#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"

namespace torchpatch {

namespace {

thread_local CaptureOutputs::State* active_capture = nullptr;

}  // namespace

struct CaptureOutputs::State {
  std::map<std::string, OutputRecorder> wanted;
  std::map<std::string, std::vector<at::Tensor>> collected;
  State* outer = nullptr;
};

void RecorderTable::add(const std::string& model_class, const std::string& name, const OutputRecorder& recorder) {
  if (name.empty() || recorder.target.empty() || recorder.index < 0) {
    throw Error(fmt::format("output recorder '{}' for {}: needs a name, a target class and an index >= 0 (got "
                            "target '{}', index {})",
                            name, model_class, recorder.target, recorder.index));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  recorders_[model_class][name] = recorder;
}

bool RecorderTable::remove(const std::string& model_class, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = recorders_.find(model_class);
  return it != recorders_.end() && it->second.erase(name) > 0;
}

std::map<std::string, OutputRecorder> RecorderTable::of(const std::string& model_class) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = recorders_.find(model_class);
  return it == recorders_.end() ? std::map<std::string, OutputRecorder>() : it->second;
}

RecorderTable& global_recorder_table() {
  static RecorderTable table;
  return table;
}

void register_output_recorder(const std::string& model_class, const std::string& name, const OutputRecorder& recorder) {
  global_recorder_table().add(model_class, name, recorder);
}
bool unregister_output_recorder(const std::string& model_class, const std::string& name) {
  return global_recorder_table().remove(model_class, name);
}
std::map<std::string, OutputRecorder> output_recorders(const std::string& model_class) {
  return global_recorder_table().of(model_class);
}

CaptureOutputs::CaptureOutputs(const std::string& model_class, const std::vector<std::string>& names,
                               const RecorderTable& recorders)
    : state_(std::make_unique<State>()) {
  const auto known = recorders.of(model_class);
  for (const auto& name : names) {
    auto it = known.find(name);
    if (it == known.end()) {
      std::vector<std::string> available;
      for (const auto& [n, r] : known) available.push_back(n);
      throw InputError(fmt::format("output '{}': {} has no recorder by that name (it has: {}); add one with "
                                   "register_output_recorder",
                                   name, model_class, available.empty() ? "none" : fmt::format("{}", fmt::join(available, ", "))));
    }
    state_->wanted.emplace(name, it->second);
    state_->collected[name];
  }
  state_->outer = active_capture;
  active_capture = state_.get();
}

CaptureOutputs::~CaptureOutputs() {
  // Closed out of order (not expected with RAII on one thread): unlink wherever it sits.
  if (active_capture == state_.get()) {
    active_capture = state_->outer;
  } else {
    for (State* s = active_capture; s; s = s->outer) {
      if (s->outer == state_.get()) {
        s->outer = state_->outer;
        break;
      }
    }
  }
}

std::map<std::string, std::vector<at::Tensor>> CaptureOutputs::take() { return std::move(state_->collected); }

bool capturing_outputs() { return active_capture != nullptr; }

void report_outputs(const PatchableModule& module, const std::vector<at::Tensor>& outputs) {
  CaptureOutputs::State* capture = active_capture;
  if (!capture) return;
  const auto& record = module.patch_record();
  for (const auto& [name, recorder] : capture->wanted) {
    if (recorder.target != record.key && recorder.target != record.class_name) continue;
    if (!recorder.layer_name.empty() && record.path.find(recorder.layer_name) == std::string::npos) continue;
    if (recorder.index >= static_cast<int>(outputs.size()) || !outputs[recorder.index].defined()) {
      throw InputError(fmt::format("output '{}': {} at {} does not provide output {} (it gave {})", name,
                                   record.class_name, record.path, recorder.index, outputs.size()));
    }
    capture->collected[name].push_back(outputs[recorder.index]);
  }
}

}  // namespace torchpatch
