#include "torchpatch/patching/scope.h"

#include <mutex>

#include "torchpatch/error.h"

#include "torchpatch/patching/class_table.h"
#include "torchpatch/patching/outputs.h"
#include "patching/scope_state.h"

namespace torchpatch {

namespace {
// Shared ownership: a scope closed out of order (or never popped) cannot leave a dangling entry.
thread_local std::vector<std::shared_ptr<ApplyPatches::State>> scope_stack;
}  // namespace

PatchTables PatchTables::global() {
  // Aliases of function-local statics: they live until exit, so nothing is owned here.
  return {std::shared_ptr<const ClassTable>(std::shared_ptr<void>(), &builtin_class_table()),
          std::shared_ptr<const RecorderTable>(std::shared_ptr<void>(), &global_recorder_table())};
}

ApplyPatches::ApplyPatches() : ApplyPatches(get_patch_mapping()) {}

ApplyPatches::ApplyPatches(PatchMapping mapping) : ApplyPatches(std::move(mapping), active_patch_tables()) {}

ApplyPatches::ApplyPatches(PatchMapping mapping, PatchTables tables) : state_(std::make_shared<State>()) {
  if (!tables.classes || !tables.recorders) throw Error("ApplyPatches: the class and recorder tables must be given");
  state_->mapping = std::move(mapping);
  state_->tables = std::move(tables);
  state_->hits.assign(state_->mapping.size(), 0);
  scope_stack.push_back(state_);
}

ApplyPatches::~ApplyPatches() {
  // Normally the innermost; scopes kept in containers may close in another order.
  for (auto it = scope_stack.rbegin(); it != scope_stack.rend(); ++it) {
    if (*it == state_) {
      scope_stack.erase(std::next(it).base());
      break;
    }
  }
}

const PatchMapping& ApplyPatches::mapping() const { return state_->mapping; }

std::vector<std::string> ApplyPatches::unmatched_keys() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < state_->hits.size(); ++i) {
    if (state_->hits[i] == 0) keys.push_back(state_->mapping.entries()[i].key);
  }
  return keys;
}

namespace detail {
ApplyPatches::State* active_patch_scope() { return scope_stack.empty() ? nullptr : scope_stack.back().get(); }
}  // namespace detail

PatchTables active_patch_tables() {
  auto* state = detail::active_patch_scope();
  return state ? state->tables : PatchTables::global();
}

const PatchMapping* active_patch_mapping() {
  auto* state = detail::active_patch_scope();
  return state ? &state->mapping : nullptr;
}

}  // namespace torchpatch
