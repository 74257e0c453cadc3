#include "torchpatch/runtime/registries.h"

namespace torchpatch {

struct Registries::Tables {
  std::shared_ptr<ClassTable> classes;
  std::shared_ptr<RecorderTable> recorders;
  std::shared_ptr<checkpoint::ConversionRegistry> conversions;
  std::shared_ptr<PatchRegistry> patches;
  std::shared_ptr<FamilyRegistry> families;
};

namespace {
// A shared_ptr that owns nothing: for the process-wide tables, which live until exit.
template <typename T>
std::shared_ptr<T> unowned(T& table) {
  return std::shared_ptr<T>(std::shared_ptr<void>(), &table);
}
}  // namespace

Registries::Registries() : tables_(std::make_shared<Tables>()) {
  auto& t = *tables_;
  t.classes = std::make_shared<ClassTable>();
  t.recorders = std::make_shared<RecorderTable>();
  t.conversions = std::make_shared<checkpoint::ConversionRegistry>();
  t.patches = std::make_shared<PatchRegistry>(t.classes);
  t.families = std::make_shared<FamilyRegistry>(*t.classes, *t.recorders, *t.conversions);
  add_builtin_families(*t.families);
}

PatchRegistry& Registries::patches() const { return *tables_->patches; }
ClassTable& Registries::classes() const { return *tables_->classes; }
RecorderTable& Registries::recorders() const { return *tables_->recorders; }
checkpoint::ConversionRegistry& Registries::conversions() const { return *tables_->conversions; }
FamilyRegistry& Registries::families() const { return *tables_->families; }

Registries Registries::with_own_patches() const {
  auto tables = std::make_shared<Tables>(*tables_);
  tables->patches = std::make_shared<PatchRegistry>(tables->classes);
  return Registries(std::move(tables));
}

PatchTables Registries::patch_tables() const { return {tables_->classes, tables_->recorders}; }

const Registries& default_registries() {
  static const Registries registries(std::make_shared<Registries::Tables>(Registries::Tables{
      unowned(builtin_class_table()), unowned(global_recorder_table()), unowned(checkpoint::global_conversions()),
      unowned(global_registry()), unowned(global_families())}));
  return registries;
}

}  // namespace torchpatch
